//! The store's lock: one daemon serves a store at a time.
//!
//! The lock is a `flock` on `<store>/daemon.lock`, which also names its
//! holder's pid. A daemon lets go of the lock as it returns, but its
//! process still has the store's databases open until it exits: threads
//! that answer the control socket, and FUSE sessions left to the next
//! daemon (`daemon --upgrade`), hold them. redb refuses a database another
//! process has open, and a session still read by a dying daemon strands
//! the requests it reads. So the next holder, once it has the lock, waits
//! for the last holder's process to be gone before it opens anything.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::protocol::{ControlError, ErrorKind};

/// How long a daemon that took the lock waits for the last holder's
/// process to end: it had let go and was exiting, which takes
/// milliseconds.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// Takes the store's lock (waiting up to `wait` for a holder to let go),
/// or says which daemon holds it.
pub(super) fn lock_store(root: &Path, wait: Duration) -> Result<File, ControlError> {
    let path = root.join("daemon.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| {
            let e = ControlError::from(e);
            ControlError::new(
                e.kind,
                format!(
                    "cannot open {}: {} (is the store writable?)",
                    path.display(),
                    e.message
                ),
            )
        })?;
    let deadline = Instant::now() + wait;
    let locked = loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Err(rustix::io::Errno::WOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => break other,
        }
    };
    let mut holder = String::new();
    let _ = file.read_to_string(&mut holder);
    let holder: Option<u32> = holder.trim().parse().ok();
    if let Err(e) = locked {
        let holder = holder.map_or("unknown".into(), |pid| pid.to_string());
        return Err(match e {
            rustix::io::Errno::WOULDBLOCK => ControlError::new(
                ErrorKind::InUse,
                format!(
                    "another layerfs daemon (pid {holder}) serves {}: use it, or stop it first",
                    root.display()
                ),
            ),
            e => super::host_error(
                format_args!("cannot lock {}", path.display()),
                std::io::Error::from(e),
            ),
        });
    }
    if let Some(pid) = holder.filter(|&pid| pid != std::process::id()) {
        if !wait_for_exit(pid, EXIT_WAIT) {
            tracing::warn!(
                pid,
                "the last daemon of this store has not exited {} s after letting go of it",
                EXIT_WAIT.as_secs()
            );
        }
    }
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = writeln!(file, "{}", std::process::id());
    Ok(file)
}

/// Waits up to `limit` for process `pid` to end, if it is a layerfs
/// daemon; false if it is still running after that. A pid written by a
/// daemon that died long ago may name another program by now: that one
/// is not waited for.
#[cfg(target_os = "linux")]
fn wait_for_exit(pid: u32, limit: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    use rustix::process::{pidfd_open, Pid, PidfdFlags};
    let Some(number) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return true;
    };
    // Opened first, so the name read next is that process's.
    let Ok(process) = pidfd_open(number, PidfdFlags::empty()) else {
        return true; // gone
    };
    let name = |of: &str| std::fs::read(format!("/proc/{of}/comm")).ok();
    if name(&pid.to_string()) != name("self") {
        return true;
    }
    // The descriptor is readable once the process has exited, after the
    // kernel closed its files.
    let timeout = Timespec {
        tv_sec: limit.as_secs() as _,
        tv_nsec: limit.subsec_nanos() as _,
    };
    let mut fds = [PollFd::new(&process, PollFlags::IN)];
    loop {
        match poll(&mut fds, Some(&timeout)) {
            Ok(n) => return n > 0,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return true,
        }
    }
}

/// Waits up to `limit` for process `pid` to end; false if it is still
/// running (or a zombie) after that.
#[cfg(not(target_os = "linux"))]
fn wait_for_exit(pid: u32, limit: Duration) -> bool {
    let Some(number) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return true;
    };
    let deadline = Instant::now() + limit;
    while rustix::process::test_kill_process(number).is_ok() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_daemon_is_told_who_holds_the_store() {
        let store = tempfile::tempdir().unwrap();
        let _held = lock_store(store.path(), Duration::ZERO).unwrap();
        let other = std::fs::File::open(store.path().join("daemon.lock")).unwrap();
        // flock locks are per open file: a second open contends as
        // another process would.
        assert!(
            rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockShared).is_err()
        );
        let err = lock_store(store.path(), Duration::from_millis(50)).unwrap_err();
        assert!(
            err.message.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        assert_eq!(err.kind, ErrorKind::InUse, "another daemon holds it");
    }

    /// Runs `sleep` under the name of the running test program, which
    /// is the name a daemon's own process has. The copy is made beside
    /// the test program (a /tmp mounted noexec would refuse it).
    #[cfg(target_os = "linux")]
    fn sleeper_named_as_this(seconds: &str) -> (tempfile::TempDir, std::process::Child) {
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
        let copy = dir.path().join(exe.file_name().unwrap());
        std::fs::copy(program_path("sleep"), &copy).unwrap();
        // A child another test forks meanwhile may hold the copy open for
        // writing until it execs: ETXTBSY for that moment.
        for _ in 0..100 {
            match std::process::Command::new(&copy).arg(seconds).spawn() {
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error()) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                spawned => {
                    let child = spawned.unwrap();
                    named_as_this(child.id());
                    return (dir, child);
                }
            }
        }
        panic!("{} stayed busy", copy.display());
    }

    /// Waits until process `pid` bears this program's name. The kernel
    /// lets a spawning parent run on once the child has its new memory,
    /// before it renames the child: until then the child bears the name of
    /// the thread that spawned it.
    #[cfg(target_os = "linux")]
    fn named_as_this(pid: u32) {
        let name = |of: &str| std::fs::read(format!("/proc/{of}/comm")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while name(&pid.to_string()) != name("self") {
            assert!(Instant::now() < deadline, "process {pid} was never renamed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[cfg(target_os = "linux")]
    fn program_path(program: &str) -> std::path::PathBuf {
        ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(program))
            .find(|p| p.exists())
            .unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_last_holders_process_is_waited_for_until_it_exits() {
        let store = tempfile::tempdir().unwrap();
        let (_bin, mut child) = sleeper_named_as_this("0.3");
        std::fs::write(
            store.path().join("daemon.lock"),
            format!("{}\n", child.id()),
        )
        .unwrap();
        let _lock = lock_store(store.path(), Duration::ZERO).unwrap();
        let exited = child.try_wait().unwrap();
        assert!(
            exited.is_some(),
            "the lock was taken while its last holder ran"
        );
        let written = std::fs::read_to_string(store.path().join("daemon.lock")).unwrap();
        assert_eq!(written.trim(), std::process::id().to_string());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pid_of_another_program_is_not_waited_for() {
        let store = tempfile::tempdir().unwrap();
        let mut other = std::process::Command::new(program_path("sleep"))
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(
            store.path().join("daemon.lock"),
            format!("{}\n", other.id()),
        )
        .unwrap();
        let started = Instant::now();
        let _lock = lock_store(store.path(), Duration::ZERO).unwrap();
        let waited = started.elapsed();
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(
            waited < Duration::from_secs(5),
            "waited {waited:?} for `sleep`"
        );
    }
}
