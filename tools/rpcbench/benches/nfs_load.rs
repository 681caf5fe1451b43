//! NULL-call load on one connection at depth 1 and 32: layerfs next to the
//! peer servers `nfs3_server` (its memfs) and `nfsserve` (a minimal fs), and a
//! raw TCP ping-pong of the same message sizes as the floor.
//!
//! Run: `cargo bench -p rpcbench --bench nfs_load -- [--seconds N]`

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use layerfs_nfs::{NFS_PROGRAM, NFS_VERSION};
use layerfs_rpc::{Dispatcher, Server, ServerConfig, ServerHandle, TransportStats};
use layerfs_vfs::LocalFs;
use rpcbench::{run_load, spawn_floor, LoadResult};

/// A NULL call to NFSv3 with an AUTH_SYS credential, as the Linux client sends.
fn null_call(xid: u32) -> Vec<u8> {
    let mut cred = Vec::new();
    for w in [0u32, 5] {
        cred.extend_from_slice(&w.to_be_bytes());
    }
    cred.extend_from_slice(b"bench\0\0\0");
    for w in [0u32, 0, 0] {
        cred.extend_from_slice(&w.to_be_bytes());
    }
    let mut body = Vec::new();
    for w in [xid, 0, 2, NFS_PROGRAM, NFS_VERSION, 0, 1, cred.len() as u32] {
        body.extend_from_slice(&w.to_be_bytes());
    }
    body.extend_from_slice(&cred);
    body.extend_from_slice(&[0; 8]);
    let mut frame = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// The framed NULL reply: mark, xid, REPLY, MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS.
fn null_reply() -> Vec<u8> {
    let mut frame = (0x8000_0000u32 | 24).to_be_bytes().to_vec();
    for w in [0u32, 1, 0, 0, 0, 0] {
        frame.extend_from_slice(&w.to_be_bytes());
    }
    frame
}

fn spawn_layerfs(dir: &std::path::Path) -> ServerHandle {
    let fs = Arc::new(LocalFs::open(dir).expect("open the export"));
    let programs = layerfs_nfs::programs(fs, b"/").expect("export");
    let server = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(Dispatcher::new(programs)),
        ServerConfig::default(),
    )
    .expect("bind layerfs");
    server.spawn().expect("start layerfs")
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
        .recv_timeout(Duration::from_secs(10))
        .expect("peer listening");
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn spawn_nfs3_server() -> SocketAddr {
    use nfs3_server::tcp::{NFSTcp, NFSTcpListener};
    spawn_tokio_peer(|port| async move {
        let fs = nfs3_server::memfs::MemFs::default();
        let listener = NFSTcpListener::bind("127.0.0.1:0", fs)
            .await
            .expect("bind nfs3_server");
        port.send(listener.get_listen_port()).unwrap();
        let _ = listener.handle_forever().await;
    })
}

fn spawn_nfsserve() -> SocketAddr {
    use nfsserve::tcp::{NFSTcp, NFSTcpListener};
    spawn_tokio_peer(|port| async move {
        let listener = NFSTcpListener::bind("127.0.0.1:0", minimal::RootOnly)
            .await
            .expect("bind nfsserve");
        port.send(listener.get_listen_port()).unwrap();
        let _ = listener.handle_forever().await;
    })
}

struct Row {
    server: &'static str,
    depth: usize,
    load: LoadResult,
    transport: Option<TransportStats>,
}

fn main() {
    let mut seconds = 2.0;
    let mut rounds = 3;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds N")
            }
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--rounds N")
            }
            _ => {}
        }
    }
    let duration = Duration::from_secs_f64(seconds);
    let export = tempfile::tempdir().expect("temporary export");
    let layerfs = spawn_layerfs(export.path());
    let targets: Vec<(&'static str, SocketAddr)> = vec![
        ("tcp floor", spawn_floor(null_reply()).expect("floor")),
        ("layerfs", layerfs.local_addr()),
        ("nfs3_server", spawn_nfs3_server()),
        ("nfsserve", spawn_nfsserve()),
    ];
    // Rounds interleave the servers so that a noisy moment on this shared
    // machine hits all of them; the table shows each one's median round.
    let mut runs: Vec<Row> = Vec::new();
    for _ in 0..rounds {
        for depth in [1usize, 32] {
            for &(server, addr) in &targets {
                let before = (server == "layerfs").then(|| layerfs.stats());
                let load =
                    run_load(addr, depth, 2000, duration, 5_000_000, null_call).expect("load run");
                // Let the last replies' counters settle before reading them.
                thread::sleep(Duration::from_millis(50));
                let transport = before.map(|b| delta(&layerfs.stats(), &b));
                runs.push(Row {
                    server,
                    depth,
                    load,
                    transport,
                });
            }
        }
    }
    let mut rows = Vec::new();
    for depth in [1usize, 32] {
        for &(server, _) in &targets {
            let mut mine: Vec<&Row> = runs
                .iter()
                .filter(|r| r.server == server && r.depth == depth)
                .collect();
            mine.sort_by(|a, b| a.load.calls_per_sec().total_cmp(&b.load.calls_per_sec()));
            let median = mine[mine.len() / 2];
            rows.push(Row {
                server,
                depth,
                load: median.load.clone(),
                transport: median.transport,
            });
        }
    }
    println!("{rounds} rounds of {seconds} s per server and depth; median round shown\n");
    print_table(&rows);
}

fn delta(after: &TransportStats, before: &TransportStats) -> TransportStats {
    TransportStats {
        connections: after.connections - before.connections,
        records: after.records - before.records,
        socket_reads: after.socket_reads - before.socket_reads,
        replies: after.replies - before.replies,
        socket_writes: after.socket_writes - before.socket_writes,
        bytes_in: after.bytes_in - before.bytes_in,
        bytes_out: after.bytes_out - before.bytes_out,
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "NULL calls, one connection (layerfs reads/record and writes/reply from its counters)\n"
    );
    println!("| server | depth | calls/s | p50 us | p99 us | reads/record | writes/reply |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (reads, writes) = match r.transport {
            Some(t) => (
                format!("{:.2}", t.socket_reads as f64 / t.records.max(1) as f64),
                format!("{:.2}", t.socket_writes as f64 / t.replies.max(1) as f64),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {} | {} |",
            r.server,
            r.depth,
            r.load.calls_per_sec(),
            r.load.p50_us,
            r.load.p99_us,
            reads,
            writes
        );
    }
    println!();
    for depth in [1usize, 32] {
        let at = |name: &str| {
            rows.iter()
                .find(|r| r.server == name && r.depth == depth)
                .map(|r| &r.load)
        };
        let (Some(ours), Some(floor)) = (at("layerfs"), at("tcp floor")) else {
            continue;
        };
        let best_peer = ["nfs3_server", "nfsserve"]
            .iter()
            .filter_map(|p| at(p).map(|l| (*p, l.calls_per_sec())))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .expect("peers ran");
        println!(
            "depth {depth}: layerfs calls/s = {:.2}x best peer ({}); layerfs p50 = {:.2}x the TCP floor",
            ours.calls_per_sec() / best_peer.1,
            best_peer.0,
            ours.p50_us / floor.p50_us
        );
    }
}

/// The smallest filesystem nfsserve will serve: a root directory and nothing else.
mod minimal {
    use async_trait::async_trait;
    use nfsserve::nfs::{fattr3, fileid3, filename3, ftype3, nfspath3, nfsstat3, sattr3};
    use nfsserve::vfs::{NFSFileSystem, ReadDirResult, VFSCapabilities};

    pub struct RootOnly;

    const ROOT: fileid3 = 1;
    const NOTSUPP: nfsstat3 = nfsstat3::NFS3ERR_NOTSUPP;

    #[async_trait]
    impl NFSFileSystem for RootOnly {
        fn capabilities(&self) -> VFSCapabilities {
            VFSCapabilities::ReadOnly
        }
        fn root_dir(&self) -> fileid3 {
            ROOT
        }
        async fn lookup(&self, _: fileid3, _: &filename3) -> Result<fileid3, nfsstat3> {
            Err(nfsstat3::NFS3ERR_NOENT)
        }
        async fn getattr(&self, id: fileid3) -> Result<fattr3, nfsstat3> {
            if id != ROOT {
                return Err(nfsstat3::NFS3ERR_STALE);
            }
            Ok(fattr3 {
                ftype: ftype3::NF3DIR,
                mode: 0o755,
                nlink: 2,
                fileid: ROOT,
                ..Default::default()
            })
        }
        async fn setattr(&self, _: fileid3, _: sattr3) -> Result<fattr3, nfsstat3> {
            Err(NOTSUPP)
        }
        async fn read(&self, _: fileid3, _: u64, _: u32) -> Result<(Vec<u8>, bool), nfsstat3> {
            Err(NOTSUPP)
        }
        async fn write(&self, _: fileid3, _: u64, _: &[u8]) -> Result<fattr3, nfsstat3> {
            Err(NOTSUPP)
        }
        async fn create(
            &self,
            _: fileid3,
            _: &filename3,
            _: sattr3,
        ) -> Result<(fileid3, fattr3), nfsstat3> {
            Err(NOTSUPP)
        }
        async fn create_exclusive(&self, _: fileid3, _: &filename3) -> Result<fileid3, nfsstat3> {
            Err(NOTSUPP)
        }
        async fn mkdir(&self, _: fileid3, _: &filename3) -> Result<(fileid3, fattr3), nfsstat3> {
            Err(NOTSUPP)
        }
        async fn remove(&self, _: fileid3, _: &filename3) -> Result<(), nfsstat3> {
            Err(NOTSUPP)
        }
        async fn rename(
            &self,
            _: fileid3,
            _: &filename3,
            _: fileid3,
            _: &filename3,
        ) -> Result<(), nfsstat3> {
            Err(NOTSUPP)
        }
        async fn readdir(
            &self,
            _: fileid3,
            _: fileid3,
            _: usize,
        ) -> Result<ReadDirResult, nfsstat3> {
            Ok(ReadDirResult {
                entries: Vec::new(),
                end: true,
            })
        }
        async fn symlink(
            &self,
            _: fileid3,
            _: &filename3,
            _: &nfspath3,
            _: &sattr3,
        ) -> Result<(fileid3, fattr3), nfsstat3> {
            Err(NOTSUPP)
        }
        async fn readlink(&self, _: fileid3) -> Result<nfspath3, nfsstat3> {
            Err(NOTSUPP)
        }
    }
}
