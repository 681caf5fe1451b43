//! What a service manager is told, and the signal it reloads with.
//!
//! - systemd's notify protocol (`$NOTIFY_SOCKET`, a unit of `Type=notify`):
//!   `READY=1` with the daemon's pid once it answers requests, `STOPPING=1`
//!   once it stops. Without the variable nothing is sent.
//! - SIGUSR1 hands over as `layerfs daemon --upgrade` asks: the daemon
//!   stops serving, leaves every mount as it is (the keeper holding the
//!   FUSE sessions) and exits 0. A manager that restarts it (systemd's
//!   `Restart=always`, launchd's `KeepAlive`) starts the binary installed
//!   now, which takes the mounts over: an upgrade with nothing unmounted,
//!   sent by the unit's `ExecReload` (contrib/systemd/).

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use sd_notify::NotifyState;

/// Tells the manager the daemon answers requests; `status` says where.
pub(crate) fn ready(status: &str) {
    tell(&[
        NotifyState::Ready,
        NotifyState::MainPid(std::process::id()),
        NotifyState::Status(status),
    ]);
}

/// Tells the manager the daemon is stopping.
pub(crate) fn stopping(status: &str) {
    tell(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn tell(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!("the service manager was not told ({e})");
    }
}

/// A flag set when SIGUSR1 asks for a hand-over.
pub(crate) fn hand_over_signal() -> io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, flag.clone())?;
    Ok(flag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn the_manager_is_told_ready_with_the_pid_then_stopping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = UnixDatagram::bind(&path).unwrap();
        // The only test that sets the variable, which nothing else reads.
        std::env::set_var("NOTIFY_SOCKET", &path);
        ready("serving");
        stopping("unmounting");
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 512];
        let n = manager.recv(&mut buf).unwrap();
        let first = std::str::from_utf8(&buf[..n]).unwrap();
        assert_eq!(
            first,
            format!("READY=1\nMAINPID={}\nSTATUS=serving\n", std::process::id())
        );
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1\nSTATUS=unmounting\n");
    }
}
