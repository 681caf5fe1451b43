//! Every system call on a call's path is accounted for: the server (this
//! binary again, as a child serving a directory) is traced with `strace -c`
//! while one connection sends 200 calls of one procedure, one at a time,
//! after a warm-up; the successful system calls per call must stay within
//! the procedure's budget, so a call that grows by one fails here.
//!
//! Counted: every system call of every server thread, but those whose
//! number follows timing rather than the call ([`strace::NOT_COUNTED`]: waits,
//! wake-ups, the allocator, the thread kept awake following the client),
//! and a socket read that found nothing yet (EAGAIN): how often a reader
//! looks before the next call arrives depends on timing, not on the call.
//!
//! Needs strace (and ptrace, which root has); says SKIPPED without it, or
//! fails with LAYERFS_REQUIRE_MOUNTS=1.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

mod support;

use layerfs_testkit::strace;
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Pack};
use support::{decode, dirop, RawClient};

const CALLS: u32 = 200;

/// Successful system calls per call each procedure may make, as measured
/// when this test was written. Every call: one `recvfrom` of the record,
/// one `writev` of the reply, one `FIONREAD` (`ioctl`, whether another
/// call is queued, for the CPU kept awake). Then the host's: a GETATTR's
/// `statx`; a READ's or WRITE's `statx` before and after, and its
/// `pread64`/`pwrite64` (and `fsync` if FILE_SYNC); a change to a directory's
/// entries its `statx` before and after and of the entry, and the call
/// itself (`openat`, `renameat2`, `unlinkat` with the `close` of the file it
/// kept open and an `fcntl`). A listing whose entries' attributes are kept
/// costs the directory's two `statx`. Lower a budget when a change saves a
/// call. In this order: RENAME moves what CREATE made, REMOVE removes it.
const BUDGETS: [(&str, f64); 13] = [
    ("NULL", 3.0),
    ("GETATTR", 4.0),
    ("SETATTR", 6.0),
    ("LOOKUP", 5.0),
    ("ACCESS", 4.0),
    ("READ 4 KiB", 6.0),
    ("WRITE 4 KiB UNSTABLE", 6.0),
    ("WRITE 4 KiB FILE_SYNC", 7.0),
    ("COMMIT", 6.0),
    ("CREATE", 7.0),
    ("RENAME", 7.0),
    ("REMOVE", 9.0),
    ("READDIRPLUS of 10", 5.0),
];

fn main() {
    if let Ok(dir) = std::env::var("LAYERFS_BUDGET_CHILD") {
        return serve_until_killed(Path::new(&dir));
    }
    if Command::new("strace").arg("-V").output().is_err() {
        let none = Err::<(), _>("strace is not installed (apt-get install strace)".to_string());
        layerfs_testkit::or_skip(none, "syscall budget per procedure");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("f"), vec![7u8; 64 * 1024]).unwrap();
    std::fs::create_dir(t.path().join("d")).unwrap();
    for i in 0..10 {
        std::fs::write(t.path().join(format!("d/e{i}")), b"x").unwrap();
    }
    std::fs::create_dir(t.path().join("scratch")).unwrap();
    let (mut server, port) = start_server(t.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handles = runtime.block_on(async {
        let mut c = support::mount(port).await;
        let root = c.root_nfs_fh3();
        let mut get = async |n: &str| support::lookup(&mut c, &root, n).await.unwrap().0;
        let (file, dir, scratch) = (get("f").await, get("d").await, get("scratch").await);
        Handles {
            root,
            file,
            dir,
            scratch,
        }
    });
    let mut measured = BTreeMap::new();
    for (name, _) in BUDGETS {
        let (per_call, which) = measure(&server, port, name, &handles);
        // Every call reads a record and writes a reply: fewer means strace
        // saw nothing (no ptrace here), which must not pass as a budget met.
        if per_call < 2.0 {
            let _ = server.kill();
            let why =
                format!("strace counted {per_call:.2} system calls per {name}: cannot trace?");
            layerfs_testkit::or_skip(Err::<(), _>(why), "syscall budget per procedure");
            return;
        }
        measured.insert(name, (per_call, which));
    }
    let _ = server.kill();
    let _ = server.wait();
    println!("successful system calls per call (budget):");
    let mut over = Vec::new();
    for (name, budget) in BUDGETS {
        let (got, which) = &measured[name];
        let got = *got;
        println!("  {name:<24} {got:>6.2} ({budget}): {which}");
        // A call one system call longer is over by 1: half of that is
        // room for what a rare call adds, and no more.
        if got > budget + 0.5 {
            over.push(format!("{name}: {got:.2} > {budget}"));
        }
    }
    assert!(over.is_empty(), "over budget: {over:?}");
    println!("test result: ok");
}

struct Handles {
    root: nfs_fh3,
    file: nfs_fh3,
    dir: nfs_fh3,
    scratch: nfs_fh3,
}

/// The child: serves `dir` on a port it prints, until it is killed.
fn serve_until_killed(dir: &Path) {
    let fs: Arc<dyn layerfs_vfs::Filesystem> = Arc::new(layerfs_vfs::LocalFs::open(dir).unwrap());
    let export = layerfs_nfs::Export::new(fs, b"/").unwrap();
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

fn start_server(dir: &Path) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("LAYERFS_BUDGET_CHILD", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let port = layerfs_testkit::first_line(&mut child).trim().parse();
    (child, port.expect("a port"))
}

/// The `seq`th call of procedure `name`: its procedure number and arguments.
fn call(name: &str, seq: u32, h: &Handles) -> (u32, Vec<u8>) {
    let mut args = Vec::new();
    let made = |prefix: &str| format!("{prefix}{seq:06}");
    let proc = match name {
        "NULL" => 0,
        "GETATTR" => {
            GETATTR3args {
                object: h.file.clone(),
            }
            .pack(&mut args)
            .unwrap();
            1
        }
        "SETATTR" => {
            let new_attributes = sattr3 {
                mode: Nfs3Option::Some(0o600 | ((seq & 1) * 0o040)),
                ..sattr3::default()
            };
            SETATTR3args {
                object: h.file.clone(),
                new_attributes,
                guard: Nfs3Option::None,
            }
            .pack(&mut args)
            .unwrap();
            2
        }
        "LOOKUP" => {
            LOOKUP3args {
                what: dirop(&h.root, "f"),
            }
            .pack(&mut args)
            .unwrap();
            3
        }
        "ACCESS" => {
            ACCESS3args {
                object: h.file.clone(),
                access: 0x3f,
            }
            .pack(&mut args)
            .unwrap();
            4
        }
        "READ 4 KiB" => {
            READ3args {
                file: h.file.clone(),
                offset: u64::from(seq % 16) * 4096,
                count: 4096,
            }
            .pack(&mut args)
            .unwrap();
            6
        }
        "WRITE 4 KiB UNSTABLE" | "WRITE 4 KiB FILE_SYNC" => {
            let data = [seq as u8; 4096];
            WRITE3args {
                file: h.file.clone(),
                offset: u64::from(seq % 16) * 4096,
                count: 4096,
                stable: match name.ends_with("FILE_SYNC") {
                    true => stable_how::FILE_SYNC,
                    false => stable_how::UNSTABLE,
                },
                data: Opaque::borrowed(&data),
            }
            .pack(&mut args)
            .unwrap();
            7
        }
        "COMMIT" => {
            COMMIT3args {
                file: h.file.clone(),
                offset: 0,
                count: 0,
            }
            .pack(&mut args)
            .unwrap();
            21
        }
        "CREATE" => {
            CREATE3args {
                where_: dirop(&h.scratch, &made("c")),
                how: createhow3::UNCHECKED(sattr3::default()),
            }
            .pack(&mut args)
            .unwrap();
            8
        }
        // Removes and renames what CREATE made (its warm-up and measured
        // calls alike: the same sequence numbers).
        "RENAME" => {
            RENAME3args {
                from: dirop(&h.scratch, &made("c")),
                to: dirop(&h.scratch, &made("r")),
            }
            .pack(&mut args)
            .unwrap();
            14
        }
        "REMOVE" => {
            REMOVE3args {
                object: dirop(&h.scratch, &made("r")),
            }
            .pack(&mut args)
            .unwrap();
            12
        }
        "READDIRPLUS of 10" => {
            READDIRPLUS3args {
                dir: h.dir.clone(),
                cookie: 0,
                cookieverf: cookieverf3::default(),
                dircount: 8192,
                maxcount: 32768,
            }
            .pack(&mut args)
            .unwrap();
            17
        }
        other => panic!("no procedure {other}"),
    };
    (proc, args)
}

/// Successful system calls per call of `name`, over `CALLS` calls, and
/// which they were.
fn measure(server: &Child, port: u16, name: &str, h: &Handles) -> (f64, String) {
    let mut c = RawClient::connect(port);
    let mut xid = 1;
    let mut run = |c: &mut RawClient, from: u32, n: u32| {
        for seq in from..from + n {
            let (proc, args) = call(name, seq, h);
            c.send(xid, proc, &RawArgs(&args));
            let (got, results) = c.recv();
            assert_eq!(got, xid);
            if proc != 0 {
                let status: u32 = decode(&results);
                assert_eq!(status, 0, "{name} call {seq} failed");
            }
            xid += 1;
        }
    };
    // Warm: the file and directory open and their attributes kept, as
    // under any steady load. CREATE, RENAME and REMOVE warm on names of
    // their own (sequence numbers past those measured).
    run(&mut c, 10_000, 20);
    let rows = strace::calls_while(server.id(), || run(&mut c, 0, CALLS));
    let mut counted = 0u64;
    let mut which = Vec::new();
    for row in rows {
        // A socket read that found nothing yet: timing, not the call.
        let looked = matches!(row.name.as_str(), "read" | "recvfrom" | "recvmsg" | "readv");
        let n = row.calls - if looked { row.errors } else { 0 };
        counted += n;
        if n >= u64::from(CALLS / 10) {
            which.push(format!("{} {:.2}", row.name, n as f64 / f64::from(CALLS)));
        }
    }
    (counted as f64 / f64::from(CALLS), which.join(", "))
}

/// Arguments already in XDR.
struct RawArgs<'a>(&'a [u8]);

impl Pack for RawArgs<'_> {
    fn packed_size(&self) -> usize {
        self.0.len()
    }

    fn pack(&self, out: &mut impl std::io::Write) -> nfs3_types::xdr_codec::Result<usize> {
        out.write_all(self.0)?;
        Ok(self.0.len())
    }
}
