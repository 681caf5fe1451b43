//! A directory's owner's write permission, lent to a server that is not
//! root for a change it must make there.
//!
//! A user may change the files in a directory of mode 0555, as on any
//! filesystem; a layered workspace then adds a name to that directory's
//! upper copy (a copy-up, a whiteout) or moves a read-only directory to
//! another parent (which rewrites its `..`). Root is never refused for a
//! mode; a server run by the user is, having no `CAP_DAC_OVERRIDE`. So the
//! change is tried, and only where it is refused for the mode, the owner's
//! write bit is set on the directories involved, the change tried once
//! more and the bit taken back.
//!
//! Meanwhile attribute reads ([`super::Stats`]) show each such directory's
//! own mode: a client that asked then would otherwise see the lent bit,
//! and the FUSE door's kernel keeps what it sees of a workspace for a day.
//! Changes that lend are made under the workspace's namespace lock, as is
//! every change of a mode by a client, so no client's `chmod` falls
//! between a lend and its return. A crash while lent leaves one permission
//! bit more, and nothing missing.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use parking_lot::Mutex;
use rustix::fs::Mode;

use super::{permissions, stat};
use crate::attr::Attr;
use crate::error::{Error, Result};

/// Directories lent the permission now: device, inode, and the mode they
/// keep.
static LENT: Mutex<Vec<(u64, u64, u32)>> = Mutex::new(Vec::new());
/// How many entries [`LENT`] holds: the one load an attribute read makes
/// while none is lent.
static LENDING: AtomicUsize = AtomicUsize::new(0);

/// Runs `change`, which writes to the directories `dirs` (adds or removes a
/// name, or moves one of them to another parent); where it is refused
/// because one of them lacks its owner's write permission, lends the owner
/// that permission for a second try and takes it back after.
pub fn lending_write<T>(dirs: &[BorrowedFd<'_>], change: impl Fn() -> Result<T>) -> Result<T> {
    match change() {
        Err(Error::Access) => {}
        done => return done,
    }
    let mut lent = Vec::new();
    for &dir in dirs {
        let (attr, dev) = stat::with_device(dir)?;
        let mode = permissions(attr.mode);
        if mode.contains(Mode::WUSR) {
            continue;
        }
        // Shown as it is before it changes.
        let entry = (dev, attr.fileid, attr.mode);
        keep_showing(entry);
        match rustix::fs::fchmod(dir, mode | Mode::WUSR) {
            Ok(()) => lent.push((dir, entry)),
            Err(_) => stop_showing(entry), // not its owner: refused as it was
        }
    }
    if lent.is_empty() {
        return Err(Error::Access);
    }
    let out = change();
    let mut restored = Ok(());
    for (dir, entry) in lent {
        restored = restored.and(rustix::fs::fchmod(dir, permissions(entry.2)));
        stop_showing(entry);
    }
    restored?;
    out
}

fn keep_showing(entry: (u64, u64, u32)) {
    LENT.lock().push(entry);
    LENDING.fetch_add(1, SeqCst);
}

fn stop_showing(entry: (u64, u64, u32)) {
    let mut all = LENT.lock();
    if let Some(i) = all.iter().position(|&e| e == entry) {
        all.swap_remove(i);
        LENDING.fetch_sub(1, SeqCst);
    }
}

/// Gives `attr`, a directory's attributes read from the host on device
/// `dev`, the mode it keeps if its owner's write permission is lent now.
pub(super) fn show_kept_mode(dev: u64, attr: &mut Attr) {
    if LENDING.load(SeqCst) == 0 {
        return;
    }
    let lent = LENT.lock();
    if let Some(&(_, _, mode)) = lent.iter().find(|e| (e.0, e.1) == (dev, attr.fileid)) {
        attr.mode = mode;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::OFlags;
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;

    /// A server that is not root, refused a change to a read-only directory
    /// it owns, is lent the write permission for it and gives it back,
    /// showing the directory's own mode meanwhile; one it does not own
    /// stays refused and unchanged.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_read_only_directory_is_lent_its_owners_write_permission_for_a_change() {
        const TEST: &str = "hostdir::a_read_only_directory_is_lent_its_owners_write_permission";
        if !rustix::process::geteuid().is_root() {
            return layerfs_testkit::skip_or_fail(TEST, "needs root, to act as a user");
        }
        let t = tempfile::tempdir().unwrap();
        let (mine, roots) = (t.path().join("mine"), t.path().join("roots"));
        for d in [&mine, &roots] {
            std::fs::create_dir(d).unwrap();
        }
        std::os::unix::fs::chown(&mine, Some(1000), Some(1000)).unwrap();
        for d in [&mine, &roots] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o555)).unwrap();
        }
        let open = |d: &std::path::Path| rustix::fs::open(d, OFlags::DIRECTORY, Mode::empty());
        let (mine_fd, roots_fd) = (open(&mine).unwrap(), open(&roots).unwrap());
        let stats = super::super::Stats::for_export(mine_fd.as_fd());
        std::thread::spawn(move || {
            // This thread alone becomes uid 1000.
            let user = rustix::fs::Uid::from_raw(1000);
            rustix::thread::set_thread_res_uid(user, user, user).unwrap();
            let seen = Mutex::new(Vec::new());
            let make = |dir: BorrowedFd<'_>| -> Result<()> {
                let (host, shown) = (stat::host_attr(dir)?, stats.fd(dir)?);
                seen.lock().push((host.mode, shown.mode));
                let flags = OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC;
                rustix::fs::openat(dir, "f", flags, Mode::from_raw_mode(0o600))?;
                Ok(())
            };
            let (mine, roots) = (mine_fd.as_fd(), roots_fd.as_fd());
            assert_eq!(make(mine), Err(Error::Access));
            lending_write(&[mine], || make(mine)).unwrap();
            // Lent on the second try, and shown as it was.
            assert_eq!(seen.lock()[2], (0o755, 0o555));
            assert_eq!(lending_write(&[roots], || make(roots)), Err(Error::Access));
        })
        .join()
        .unwrap();
        assert!(mine.join("f").exists());
        assert!(!roots.join("f").exists());
        for d in [&mine, &roots] {
            let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o555, "{}", d.display());
        }
        assert_eq!(LENDING.load(SeqCst), 0, "a lend left behind");
    }
}
