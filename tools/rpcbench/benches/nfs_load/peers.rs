//! The tree every server holds, and the peers that serve it from memory:
//! each run in a process of its own (`nfs_load --serve KIND`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::thread;

/// What every server holds: `file` (1 byte), `big/` with `BIG_DIR` empty
/// files, `huge/` with `HUGE_DIR`, `data.bin` of `DATA_LEN` bytes and an
/// empty `scratch/`.
pub const BIG_DIR: usize = 1000;
pub const HUGE_DIR: usize = 100_000;
pub const DATA_LEN: usize = 256 << 20;

/// Files in `huge/`: none (and no `huge/`) when no test lists it, so that
/// preparing a run of other tests takes seconds rather than minutes. Set
/// once, before anything is filled; children are told with `--huge N`.
static HUGE_FILES: AtomicUsize = AtomicUsize::new(HUGE_DIR);

pub fn huge_files() -> usize {
    HUGE_FILES.load(Relaxed)
}

pub fn set_huge_files(n: usize) {
    HUGE_FILES.store(n, Relaxed);
}

pub fn data() -> Vec<u8> {
    (0..DATA_LEN).map(|i| (i * 31 % 251) as u8).collect()
}

fn files(dir: &Path, range: std::ops::Range<usize>) {
    std::fs::create_dir_all(dir).unwrap();
    for i in range {
        std::fs::write(dir.join(format!("f{i:06}")), b"").unwrap();
    }
}

/// The tree in one directory.
pub fn fill_dir(dir: &Path) {
    std::fs::write(dir.join("file"), b"x").unwrap();
    files(&dir.join("big"), 0..BIG_DIR);
    if huge_files() > 0 {
        files(&dir.join("huge"), 0..huge_files());
    }
    std::fs::write(dir.join("data.bin"), data()).unwrap();
    std::fs::create_dir(dir.join("scratch")).unwrap();
}

/// The tree as five read-only layers under `root`, bottom first, as an
/// image's layers hold it: `big/` and `huge/` are each merged from two
/// layers, every layer adds a directory of its own.
pub fn fill_layers(root: &Path) -> Vec<PathBuf> {
    let layers: Vec<PathBuf> = (1..=5).map(|n| root.join(format!("layer{n}"))).collect();
    for (n, l) in layers.iter().enumerate() {
        std::fs::create_dir_all(l.join(format!("only-in-{}", n + 1))).unwrap();
    }
    let huge = huge_files();
    if huge > 0 {
        files(&layers[0].join("huge"), 0..huge / 2);
        files(&layers[2].join("huge"), huge / 2..huge);
    }
    files(&layers[1].join("big"), 0..BIG_DIR / 2);
    std::fs::write(layers[2].join("data.bin"), data()).unwrap();
    std::fs::create_dir(layers[3].join("scratch")).unwrap();
    files(&layers[4].join("big"), BIG_DIR / 2..BIG_DIR);
    std::fs::write(layers[4].join("file"), b"x").unwrap();
    layers
}

/// Serves one peer in this process, prints `ready PORT...` and serves
/// until standard input closes (the load generator exited or let go).
pub fn serve_child(kind: &str) {
    let ports: Vec<u16> = match kind {
        "nfs3_server" => vec![spawn_nfs3_server()],
        "nfsserve" => vec![spawn_nfsserve()],
        "floor" => [
            crate::report::null_reply(),
            crate::report::reply_of(crate::workloads::MIB),
        ]
        .into_iter()
        .map(|reply| rpcbench::spawn_floor(reply).expect("floor").port())
        .collect(),
        _ => panic!("--serve nfs3_server|nfsserve|floor"),
    };
    let line: Vec<String> = ports.iter().map(u16::to_string).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", line.join(" ")).unwrap();
    out.flush().unwrap();
    drop(out);
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
}

/// Runs a peer's tokio listener on a thread of its own; returns its port.
fn spawn_tokio_peer<F, Fut>(start: F) -> u16
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
    port_rx.recv().expect("peer listening")
}

/// nfs3_server's memfs finds a name by scanning its directory, so making
/// `huge/` would take minutes: it holds the tree without it.
fn spawn_nfs3_server() -> u16 {
    use nfs3_server::memfs::{MemFs, MemFsConfig};
    use nfs3_server::tcp::{NFSTcp, NFSTcpListener};
    let mut config = MemFsConfig::default();
    config.add_file("/file", b"x".to_vec());
    config.add_dir("/big");
    for i in 0..BIG_DIR {
        config.add_file(&format!("/big/f{i:06}"), Vec::new());
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

fn spawn_nfsserve() -> u16 {
    use nfsserve::tcp::{NFSTcp, NFSTcpListener};
    let fs = crate::memfs::MemFs::new();
    let root = fs.root();
    fs.add(root, "file", false, b"x".to_vec());
    let big = fs.add(root, "big", true, Vec::new());
    for i in 0..BIG_DIR {
        fs.add(big, &format!("f{i:06}"), false, Vec::new());
    }
    if huge_files() > 0 {
        let huge = fs.add(root, "huge", true, Vec::new());
        for i in 0..huge_files() {
            fs.add(huge, &format!("f{i:06}"), false, Vec::new());
        }
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
