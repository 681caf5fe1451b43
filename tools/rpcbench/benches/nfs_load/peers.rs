//! The servers measured: layerfs in-process over a directory, and the peers
//! over in-memory filesystems holding the same data.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use layerfs_rpc::{ServerConfig, ServerHandle};
use layerfs_vfs::LocalFs;

/// What every server holds: `file` (1 byte), `big/` with `BIG_DIR` empty
/// files, `data.bin` of `DATA_LEN` bytes and an empty `scratch/`.
pub const BIG_DIR: usize = 1000;
pub const DATA_LEN: usize = 256 << 20;

fn data() -> Vec<u8> {
    (0..DATA_LEN).map(|i| (i * 31 % 251) as u8).collect()
}

pub fn fill_dir(dir: &Path) {
    std::fs::write(dir.join("file"), b"x").unwrap();
    std::fs::create_dir(dir.join("big")).unwrap();
    for i in 0..BIG_DIR {
        std::fs::write(dir.join(format!("big/f{i:04}")), b"").unwrap();
    }
    std::fs::write(dir.join("data.bin"), data()).unwrap();
    std::fs::create_dir(dir.join("scratch")).unwrap();
}

pub fn spawn_layerfs(dir: &Path) -> ServerHandle {
    let fs = Arc::new(LocalFs::open(dir).expect("open the export"));
    let addr = "127.0.0.1:0".parse().unwrap();
    layerfs_nfs::serve(fs, b"/", addr, ServerConfig::default()).expect("start layerfs")
}

/// Runs a peer's tokio listener on a thread of its own; returns its address.
fn spawn_tokio_peer<F, Fut>(start: F) -> SocketAddr
where
    F: FnOnce(std::sync::mpsc::Sender<u16>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(start(port_tx));
    });
    let port = port_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("peer listening");
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub fn spawn_nfs3_server() -> SocketAddr {
    use nfs3_server::memfs::{MemFs, MemFsConfig};
    use nfs3_server::tcp::{NFSTcp, NFSTcpListener};
    let mut config = MemFsConfig::default();
    config.add_file("/file", b"x".to_vec());
    config.add_dir("/big");
    for i in 0..BIG_DIR {
        config.add_file(&format!("/big/f{i:04}"), Vec::new());
    }
    config.add_file("/data.bin", data());
    config.add_dir("/scratch");
    spawn_tokio_peer(move |port| async move {
        let fs = MemFs::new(config).expect("nfs3_server memfs");
        let listener = NFSTcpListener::bind("127.0.0.1:0", fs)
            .await
            .expect("bind nfs3_server");
        port.send(listener.get_listen_port()).unwrap();
        let _ = listener.handle_forever().await;
    })
}

pub fn spawn_nfsserve() -> SocketAddr {
    use nfsserve::tcp::{NFSTcp, NFSTcpListener};
    let fs = crate::memfs::MemFs::new();
    let root = fs.root();
    fs.add(root, "file", false, b"x".to_vec());
    let big = fs.add(root, "big", true, Vec::new());
    for i in 0..BIG_DIR {
        fs.add(big, &format!("f{i:04}"), false, Vec::new());
    }
    fs.add(root, "data.bin", false, data());
    fs.add(root, "scratch", true, Vec::new());
    spawn_tokio_peer(move |port| async move {
        let listener = NFSTcpListener::bind("127.0.0.1:0", fs)
            .await
            .expect("bind nfsserve");
        port.send(listener.get_listen_port()).unwrap();
        let _ = listener.handle_forever().await;
    })
}
