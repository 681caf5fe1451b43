//! Every system call of a copy-up is accounted for: the first open for
//! writing of a lower file (what FUSE's OPEN and an NFS WRITE to a lower
//! file start with), after the lookup that found it, must stay within
//! [`BUDGET`] host system calls, so a copy-up that grows by one fails here.
//!
//! This binary runs itself as a child under `strace -c -f` twice, once
//! opening the stack and copying nothing up and once copying up [`FILES`]
//! files; the difference, per file, is what a lookup and a copy-up cost.
//! Counted: every system call, failed ones too (a `statx` that finds no
//! upper entry costs as much as one that does), but those whose number
//! follows timing rather than the copy ([`strace::NOT_COUNTED`]). A debug
//! build checks each descriptor std closes with an `fcntl`: there, one
//! `fcntl` per `close` is not counted, and any other is.
//!
//! Needs strace (and ptrace, which root has); says SKIPPED without it, or
//! fails with LAYERFS_REQUIRE_MOUNTS=1.

use std::path::Path;
use std::process::{Command, Stdio};

use layerfs_layers::StackFs;
use layerfs_testkit::strace;
use layerfs_vfs::{Caller, Filesystem};

const FILES: usize = 200;

/// Host system calls per lookup and copy-up of a small lower file, every
/// name looked up before the first copy-up, as measured when this test was
/// written (as root, on a filesystem that refuses a clone): the lookup's
/// `statx` of the directory and of the name (in its layer: the upper has no
/// such directory yet); the open's `statx` of the lower file under the
/// namespace lock (before it, the place the lookup kept is taken as it was:
/// other files' copy-ups do not move it); the copy, through descriptors
/// (`openat` and `fstat` of the lower file, `openat` and `statx` of the
/// copy, `flistxattr` of the lower file, one `copy_file_range`, `fchmod`,
/// `utimensat`, `fsync`, the lower file's `close`; no `fchown` of root's
/// file by root); the identity's log `write`; the directory's times
/// (`statx`, `utimensat`) around the `renameat`; the copy, still open, is
/// the open file, known by the identity the copy-up gave it (no `statx`),
/// and is closed once the stack lets it go. Lower the budget when a change
/// saves a call.
const BUDGET: f64 = 18.0;

fn main() {
    if let Ok(dir) = std::env::var("LAYERFS_COPY_UP_CHILD") {
        let files: usize = std::env::var("LAYERFS_COPY_UP_FILES")
            .unwrap()
            .parse()
            .unwrap();
        copy_up(Path::new(&dir), files);
        // No destructors: closing what the stack keeps open is not the copy's.
        std::process::exit(0);
    }
    if Command::new("strace").arg("-V").output().is_err() {
        let none = Err::<(), _>("strace is not installed (apt-get install strace)".to_string());
        layerfs_testkit::or_skip(none, "system calls per copy-up");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("lower/d")).unwrap();
    for i in 0..FILES {
        std::fs::write(t.path().join(format!("lower/d/f{i}")), b"a line\n").unwrap();
    }
    let none = count(t.path(), 0);
    let all = count(t.path(), FILES);
    let (Some(none), Some(all)) = (none, all) else {
        let why = "strace counted nothing: cannot trace?".to_string();
        layerfs_testkit::or_skip(Err::<(), _>(why), "system calls per copy-up");
        return;
    };
    let per_file = (all.0 - none.0) as f64 / FILES as f64;
    let budget = BUDGET;
    println!("system calls per lookup and copy-up: {per_file:.2} (budget {budget})");
    let mut which: Vec<String> = all
        .1
        .iter()
        .filter_map(|(name, n)| {
            let before = none
                .1
                .iter()
                .find(|(m, _)| m == name)
                .map_or(0, |(_, n)| *n);
            let per = (n - before) as f64 / FILES as f64;
            (per >= 0.5).then(|| format!("{name} {per:.2}"))
        })
        .collect();
    which.sort();
    println!("  {}", which.join(", "));
    // Every copy-up opens, copies and renames: fewer means strace saw
    // nothing of them, which must not pass as a budget met.
    assert!(
        per_file >= 5.0,
        "only {per_file:.2} system calls per copy-up counted"
    );
    assert!(
        per_file <= budget + 0.5,
        "over budget: {per_file:.2} > {budget}"
    );
    println!("test result: ok");
}

/// The child: opens the stack of `dir/lower` under a fresh upper and copies
/// up the first `files` files of `d`, each looked up first.
fn copy_up(dir: &Path, files: usize) {
    let upper = dir.join(format!("upper-{files}"));
    let fs = StackFs::open_in_upper(&[dir.join("lower")], &upper).unwrap();
    let caller = Caller::root();
    let d = fs.lookup(&caller, 1, b"d").unwrap().fileid;
    let host = fs.host_files().unwrap();
    // Every name looked up first, as a walk of the tree would, then each
    // file opened for writing: a copy-up changes the directory, and the
    // files found before it are opened without being looked for again.
    let found: Vec<_> = (0..files)
        .map(|i| fs.lookup(&caller, d, format!("f{i}").as_bytes()).unwrap())
        .collect();
    for (i, f) in found.iter().enumerate() {
        let fd = host.host_file(&caller, f.fileid, true).unwrap();
        assert!(fd.is_some(), "f{i} was not copied up");
    }
}

/// The system calls of a child copying up `files` files: the total and
/// each one's count, or None where strace counted none.
fn count(dir: &Path, files: usize) -> Option<(u64, Vec<(String, u64)>)> {
    let out = tempfile::NamedTempFile::new().unwrap();
    let status = Command::new("strace")
        .args(strace::ARGS)
        .arg("-o")
        .arg(out.path())
        .arg(std::env::current_exe().unwrap())
        .env("LAYERFS_COPY_UP_CHILD", dir)
        .env("LAYERFS_COPY_UP_FILES", files.to_string())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the child copying up {files} files failed"
    );
    let mut rows = strace::counts(&std::fs::read_to_string(out.path()).unwrap());
    strace::leave_out_debug_close_checks(&mut rows);
    let each: Vec<(String, u64)> = rows.into_iter().map(|row| (row.name, row.calls)).collect();
    let total = each.iter().map(|(_, n)| n).sum();
    (total > 0).then_some((total, each))
}
