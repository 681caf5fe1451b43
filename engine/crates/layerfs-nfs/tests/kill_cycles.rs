//! kill -9 of the server at random moments under a write-heavy workload,
//! then a restart, cycle after cycle, for a plain directory (`LocalFs`) and
//! a stack (`StackFs`, whose first writes copy lower files up). After each
//! restart: every byte acknowledged FILE_SYNC, or UNSTABLE and covered by a
//! successful COMMIT, reads back; every handle handed out still resolves to
//! the same file id; a lower file's bytes that were never written are the
//! lower's.
//!
//! Runs `LAYERFS_KILL_CYCLES` cycles per filesystem (default 3; the tool
//! tools/kill-cycles/run runs many). The server is this same test binary,
//! started again as a child with `LAYERFS_KILL_CHILD` set.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

mod support;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use support::{cred, dirop, Conn};

const CHUNK: usize = 64 * 1024;
/// Bytes of the lower file the stack's writes copy up.
const LOWER_LEN: usize = 1024 * 1024;

fn main() {
    if let Ok(what) = std::env::var("LAYERFS_KILL_CHILD") {
        return serve_until_killed(
            &what,
            Path::new(&std::env::var("LAYERFS_KILL_DIR").unwrap()),
        );
    }
    let cycles: usize = std::env::var("LAYERFS_KILL_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let seed = std::env::var("LAYERFS_KILL_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("kill cycles: {cycles} per filesystem, seed {seed} (LAYERFS_KILL_SEED to repeat)");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for what in ["flat", "stack"] {
        let summary = runtime.block_on(run_cycles(what, cycles, seed));
        println!("{what}: {summary}");
    }
    println!("test result: ok");
}

/// The child: serves the directory (or the stack in it) on a port it
/// prints, until it is killed.
fn serve_until_killed(what: &str, dir: &Path) {
    let fs: Arc<dyn layerfs_vfs::Filesystem> = match what {
        "flat" => Arc::new(layerfs_vfs::LocalFs::open(&dir.join("export")).unwrap()),
        _ => Arc::new(
            layerfs_layers::StackFs::open(
                &[dir.join("lower")],
                &dir.join("upper"),
                &dir.join("state"),
            )
            .unwrap(),
        ),
    };
    let mut export = layerfs_nfs::Export::new(fs, b"/").unwrap();
    // As a store keeps its key: handles outlive the restarts.
    export.key = layerfs_nfs::HandleKey::from_bytes([9; 32]);
    let server = layerfs_nfs::serve_export(
        export,
        "127.0.0.1:0".parse().unwrap(),
        layerfs_rpc::ServerConfig::default(),
    )
    .unwrap();
    println!("{}", server.local_addr().port());
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn start_server(what: &str, dir: &Path) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("LAYERFS_KILL_CHILD", what)
        .env("LAYERFS_KILL_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = layerfs_testkit::first_line(&mut child);
    let port = line.trim().parse().unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("the server did not start: {line:?}")
    });
    (child, port)
}

async fn connect(port: u16) -> Conn {
    nfs3_client::Nfs3ConnectionBuilder::new(nfs3_client::tokio::TokioConnector, "127.0.0.1", "/")
        .mount_port(port)
        .nfs3_port(port)
        .connect_from_privileged_port(false)
        .credential(cred(0, 0))
        .mount()
        .await
        .expect("mount")
}

/// The bytes written at `offset` of file `file` (never the same twice, so a
/// region holds what one write put there or nothing).
fn pattern(file: usize, offset: u64) -> Vec<u8> {
    layerfs_testkit::bytes_from(
        (file as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ offset ^ 0x9E37_79B9_7F4A_7C15,
        CHUNK,
    )
}

fn lower_byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// What the client was told: per file, its handle, file id, and the
/// regions acknowledged durable; plus the next offset to write.
#[derive(Default)]
struct Acked {
    files: Vec<(nfs_fh3, u64)>,
    /// Region -> the cycle that wrote it.
    durable: BTreeMap<(usize, u64), usize>,
    next: Vec<u64>,
}

async fn run_cycles(what: &str, cycles: usize, seed: u64) -> String {
    let dir = tempfile::tempdir().unwrap();
    let lower_file = dir.path().join("lower/lower-file");
    match what {
        "flat" => std::fs::create_dir(dir.path().join("export")).unwrap(),
        _ => {
            std::fs::create_dir(dir.path().join("lower")).unwrap();
            let bytes: Vec<u8> = (0..LOWER_LEN).map(lower_byte).collect();
            std::fs::write(&lower_file, bytes).unwrap();
        }
    }
    let mut rng = seed ^ (what.len() as u64) << 32 | 1;
    let mut next_random = move |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };
    let mut acked = Acked::default();
    let mut writes = 0u64;
    for cycle in 0..cycles {
        let (child, port) = start_server(what, dir.path());
        let mut c = connect(port).await;
        // What the cycle before wrote (all of it is checked at the end).
        verify(&mut c, &acked, what, cycle.saturating_sub(1)).await;
        let root = c.root_nfs_fh3();
        if cycle == 0 && what == "stack" {
            let res = c
                .lookup(&LOOKUP3args {
                    what: dirop(&root, "lower-file"),
                })
                .await
                .unwrap()
                .unwrap();
            let id = res.obj_attributes.unwrap().fileid;
            acked.files.push((res.object, id));
            acked.next.push(LOWER_LEN as u64);
        }
        // Writes until the kill, which comes at a random moment after the
        // cycle's first durable write, from another thread: in the middle
        // of a call as likely as between two.
        let kill_after = Duration::from_millis(next_random(250));
        let (first_durable, durable_seen) = std::sync::mpsc::channel::<()>();
        let mut child = child;
        let killer = std::thread::spawn(move || {
            // A cycle that made nothing durable checks nothing: it fails
            // below; the kill comes anyway.
            let _ = durable_seen.recv_timeout(Duration::from_secs(30));
            std::thread::sleep(kill_after);
            let _ = child.kill();
            child
        });
        let durable_before = acked.durable.len();
        let mut pending: Vec<(usize, u64)> = Vec::new();
        // A plain blocking client for the writes: a kill in the middle of a
        // call must end the call with an error, whatever the client library.
        let mut wire = Wire::connect(port);
        let outcome: Result<(), CallError> = (|| {
            loop {
                if acked.files.is_empty() || next_random(8) == 0 {
                    let name = format!("f{}-{}", cycle, acked.files.len());
                    let made: CREATE3res = wire.call(
                        8,
                        &CREATE3args {
                            where_: dirop(&root, &name),
                            how: createhow3::GUARDED(sattr3::default()),
                        },
                    )?;
                    let ok = status("CREATE", made)?;
                    let fh = ok.obj.unwrap();
                    let id = match ok.obj_attributes {
                        Nfs3Option::Some(a) => a.fileid,
                        Nfs3Option::None => panic!("CREATE without attributes"),
                    };
                    acked.files.push((fh, id));
                    acked.next.push(0);
                }
                let file = next_random(acked.files.len() as u64) as usize;
                let offset = acked.next[file];
                acked.next[file] += CHUNK as u64;
                let data = pattern(file, offset);
                let stable = if next_random(2) == 0 {
                    stable_how::FILE_SYNC
                } else {
                    stable_how::UNSTABLE
                };
                let res: WRITE3res = wire.call(
                    7,
                    &WRITE3args {
                        file: acked.files[file].0.clone(),
                        offset,
                        count: CHUNK as u32,
                        stable,
                        data: Opaque::borrowed(&data),
                    },
                )?;
                let res = status("WRITE", res)?;
                assert_eq!(res.count as usize, CHUNK, "a short write");
                writes += 1;
                if res.committed == stable_how::FILE_SYNC {
                    acked.durable.insert((file, offset), cycle);
                    let _ = first_durable.send(());
                } else {
                    pending.push((file, offset));
                }
                if pending.len() >= 4 {
                    let (f, _) = pending[0];
                    let res: COMMIT3res = wire.call(
                        21,
                        &COMMIT3args {
                            file: acked.files[f].0.clone(),
                            offset: 0,
                            count: 0,
                        },
                    )?;
                    status("COMMIT", res)?;
                    // COMMIT covers one file: the others' writes stay pending.
                    pending.retain(|&(pf, off)| {
                        if pf == f {
                            acked.durable.insert((pf, off), cycle);
                        }
                        pf != f
                    });
                    let _ = first_durable.send(());
                }
            }
        })();
        // Only the kill may end the cycle: a refusal, a reply that does not
        // decode, or anything but a closed connection is a failure.
        match outcome {
            Err(CallError::Closed(how)) => println!("cycle {cycle}: the connection ended: {how}"),
            Err(CallError::Failed(e)) => panic!("cycle {cycle}: {e}"),
            Ok(()) => unreachable!("the write loop ends only with an error"),
        }
        let mut child = killer.join().unwrap();
        let died = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            died.signal(),
            Some(9),
            "cycle {cycle}: the server ended on its own ({died}), not by the kill"
        );
        assert!(
            acked.durable.len() > durable_before,
            "cycle {cycle}: nothing was acknowledged durable before the kill"
        );
    }
    // A last restart to check the last cycle's writes.
    let (mut child, port) = start_server(what, dir.path());
    let mut c = connect(port).await;
    verify(&mut c, &acked, what, 0).await;
    let _ = child.kill();
    let _ = child.wait();
    format!(
        "{cycles} kills at random moments, {writes} writes answered, {} regions of 64 KiB \
         acknowledged durable and read back, {} files' handles resolved after every restart",
        acked.durable.len(),
        acked.files.len()
    )
}

/// Every handle resolves to its file id; every region acknowledged durable
/// from cycle `since` on reads back; the lower file's unwritten bytes are
/// the lower's.
async fn verify(c: &mut Conn, acked: &Acked, what: &str, since: usize) {
    for (i, (fh, id)) in acked.files.iter().enumerate() {
        let res = c
            .getattr(&GETATTR3args { object: fh.clone() })
            .await
            .unwrap();
        let attr =
            status("GETATTR", res).unwrap_or_else(|e| panic!("file {i}: {e} after a restart"));
        assert_eq!(attr.obj_attributes.fileid, *id, "file {i} changed id");
    }
    for (&(file, offset), _) in acked.durable.iter().filter(|(_, &c)| c >= since) {
        let got = c
            .read(&READ3args {
                file: acked.files[file].0.clone(),
                offset,
                count: CHUNK as u32,
            })
            .await
            .unwrap();
        let got = status("READ", got).unwrap_or_else(|e| panic!("file {file}: {e}"));
        assert!(
            got.data.as_ref() == pattern(file, offset).as_slice(),
            "file {file} at {offset}: acknowledged bytes lost"
        );
    }
    if what == "stack" && !acked.files.is_empty() {
        let mut offset = 0;
        while offset < LOWER_LEN {
            let got = c
                .read(&READ3args {
                    file: acked.files[0].0.clone(),
                    offset: offset as u64,
                    count: 256 * 1024,
                })
                .await
                .unwrap()
                .unwrap();
            for (i, b) in got.data.iter().enumerate() {
                assert_eq!(
                    *b,
                    lower_byte(offset + i),
                    "lower byte {} changed",
                    offset + i
                );
            }
            offset += got.data.len();
        }
    }
}

/// Why a call gave no results.
#[derive(Debug)]
enum CallError {
    /// The connection ended before the reply: what a kill does.
    Closed(String),
    /// Anything else: a refusal, a reply that does not decode.
    Failed(String),
}

impl From<String> for CallError {
    fn from(e: String) -> CallError {
        CallError::Failed(e)
    }
}

/// A blocking NFS client over one connection: a call's results, or an
/// error when the connection ends before its reply.
struct Wire {
    stream: std::net::TcpStream,
    records: layerfs_rpc::Records<std::net::TcpStream>,
    xid: u32,
}

impl Wire {
    fn connect(port: u16) -> Wire {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let records = layerfs_rpc::Records::new(stream.try_clone().unwrap());
        Wire {
            stream,
            records,
            xid: 1,
        }
    }

    fn call<T: for<'a> nfs3_types::xdr_codec::Unpack>(
        &mut self,
        proc: u32,
        args: &impl nfs3_types::xdr_codec::Pack,
    ) -> Result<T, CallError> {
        use std::io::Write;
        self.xid += 1;
        let frame = support::RawClient::frame(self.xid, 100_003, proc, args);
        let closed = |e: std::io::Error| CallError::Closed(e.to_string());
        self.stream.write_all(&frame).map_err(closed)?;
        let record = self
            .records
            .next_record()
            .map_err(closed)?
            .ok_or_else(|| CallError::Closed("the connection closed".into()))?;
        let bytes = record.as_bytes();
        // xid, REPLY, MSG_ACCEPTED, verifier (flavor, empty), SUCCESS.
        if bytes.len() < 24 || bytes[8..12] != [0; 4] || bytes[20..24] != [0; 4] {
            return Err(format!("proc {proc}: not an accepted, successful reply").into());
        }
        let mut body = &bytes[24..];
        T::unpack(&mut body)
            .map(|(v, _)| v)
            .map_err(|e| format!("proc {proc}: {e:?}").into())
    }
}

/// The results of a call that succeeded, or what it failed with.
fn status<T, E>(what: &str, res: Nfs3Result<T, E>) -> Result<T, String> {
    match res {
        Nfs3Result::Ok(ok) => Ok(ok),
        Nfs3Result::Err((s, _)) => Err(format!("{what} {s:?}")),
    }
}
