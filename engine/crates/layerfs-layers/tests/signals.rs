//! Copy-ups under a stream of signals caught by a handler installed without
//! `SA_RESTART`, as a fuzzer's or a profiler's timer is: the kernel fails a
//! copy such a signal interrupts with EINTR, and none may reach a caller.
//!
//! Its own harness: the signal goes to the whole process, and this test is
//! then the process's only thread, so every signal lands on its calls.

use std::io::Write;
use std::path::Path;

use layerfs_layers::StackFs;
use layerfs_vfs::{Caller, Filesystem, Stability};

const FILES: usize = 300;
/// Large enough that the kernel's copy takes several signal intervals.
const SIZE: usize = 256 << 10;
/// How often the timer fires.
const INTERVAL_US: libc::suseconds_t = 50;

extern "C" fn caught(_: libc::c_int) {}

/// Starts (or, with 0, stops) a timer whose SIGALRM interrupts system calls.
fn interrupt_every(us: libc::suseconds_t) {
    let every = libc::timeval {
        tv_sec: 0,
        tv_usec: us,
    };
    let timer = libc::itimerval {
        it_interval: every,
        it_value: every,
    };
    // SAFETY: a handler that does nothing is async-signal-safe, and both
    // structures are fully initialised.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = caught as extern "C" fn(libc::c_int) as libc::sighandler_t;
        assert_eq!(
            libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut()),
            0
        );
        assert_eq!(
            libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()),
            0
        );
    }
}

/// Copies `FILES` lower files up in a workspace under `base` while the timer
/// runs; each must come up whole.
fn copy_ups_under_signals(base: &Path) {
    let t = tempfile::tempdir_in(base).unwrap();
    let lower = t.path().join("lower");
    std::fs::create_dir(&lower).unwrap();
    let content = |i: usize| -> Vec<u8> { (0..SIZE).map(|b| (b ^ i) as u8).collect() };
    for i in 0..FILES {
        let mut f = std::fs::File::create(lower.join(format!("f{i}"))).unwrap();
        f.write_all(&content(i)).unwrap();
    }
    let fs = StackFs::open_in_upper(&[lower], &t.path().join("upper")).unwrap();
    let who = Caller::root();

    interrupt_every(INTERVAL_US);
    let mut failed = Vec::new();
    for i in 0..FILES {
        let name = format!("f{i}");
        let f = fs.lookup(&who, fs.root(), name.as_bytes()).unwrap().fileid;
        // The first change copies the file up.
        if let Err(e) = fs.write(&who, f, 0, b"!", Stability::Unstable) {
            failed.push(format!("{name}: {e:?}"));
        }
    }
    interrupt_every(0);

    assert!(
        failed.is_empty(),
        "{}: copy-ups failed: {failed:?}",
        base.display()
    );
    for i in 0..FILES {
        let mut want = content(i);
        want[0] = b'!';
        let got = std::fs::read(t.path().join(format!("upper/f{i}"))).unwrap();
        assert!(got == want, "{}: f{i} was not copied whole", base.display());
    }
    println!(
        "signals: {FILES} copy-ups in {} under a timer every {INTERVAL_US} us: ok",
        base.display()
    );
}

fn main() {
    // The temporary directory's filesystem, and tmpfs where there is one.
    let shm = Path::new("/dev/shm");
    let mut bases = vec![std::env::temp_dir()];
    if shm.is_dir() && rustix::fs::access(shm, rustix::fs::Access::WRITE_OK).is_ok() {
        bases.push(shm.to_path_buf());
    }
    for base in &bases {
        copy_ups_under_signals(base);
    }
}
