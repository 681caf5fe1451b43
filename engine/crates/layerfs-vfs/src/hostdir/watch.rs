//! Change notices for host directories (inotify on Linux): what lets a
//! listing serve attributes it read before without serving a change late.
//!
//! The kernel queues a notice for a change to an entry of a watched
//! directory before the call that made the change returns. So whoever takes
//! every queued notice before using what it kept has seen every change that
//! finished before it began, whoever made it.
//!
//! What reaches a directory's watch is a change made through a name in it.
//! A file changed through a hard link in another directory, a file written
//! through a shared mapping, a directory's own entries changing, and any
//! change on a filesystem the kernel does not see change (a network or FUSE
//! filesystem, the layers under an overlay) send nothing here: callers keep
//! nothing for such files, or keep it only briefly.

use std::os::fd::{BorrowedFd, OwnedFd};

/// A watch's number, as the kernel gave it.
pub type WatchId = i32;

/// One change notice.
#[derive(Debug, PartialEq, Eq)]
pub enum Notice<'a> {
    /// The entry `name` of a watched directory changed, was made, removed
    /// or renamed.
    Entry { watch: WatchId, name: &'a [u8] },
    /// The watched directory itself changed or moved.
    Dir { watch: WatchId },
    /// The watch ended: its directory is gone, or it was unwatched.
    Ended { watch: WatchId },
    /// Notices were lost (the kernel's queue was full): anything may have
    /// changed.
    Lost,
}

/// Watches on host directories, with one queue of notices.
pub struct Watcher {
    fd: OwnedFd,
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;
    use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
    use rustix::io::Errno;
    use std::mem::MaybeUninit;
    use std::os::fd::{AsFd, AsRawFd};

    /// Every change to an entry's contents, attributes or name, and to the
    /// directory itself. Reads (IN_ACCESS) are left out: they would cost
    /// every READ a notice, and only move atime.
    fn changes() -> WatchFlags {
        WatchFlags::MODIFY
            | WatchFlags::ATTRIB
            | WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ONLYDIR
    }

    impl Watcher {
        /// A watcher, or `None` where the host gives none (the user's limit
        /// on inotify instances, say): then nothing should be kept.
        pub fn new() -> Option<Watcher> {
            match inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC) {
                Ok(fd) => Some(Watcher { fd }),
                Err(e) => {
                    tracing::info!("no inotify instance ({e}): listed attributes are not kept");
                    None
                }
            }
        }

        /// Starts watching the directory open as `dir`; the same directory
        /// watched twice has one id.
        pub fn watch(&self, dir: BorrowedFd<'_>) -> rustix::io::Result<WatchId> {
            // inotify takes a path; the descriptor's own is the directory
            // already checked, whatever its name has become.
            let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
            inotify::add_watch(&self.fd, path, changes())
        }

        pub fn unwatch(&self, watch: WatchId) {
            // EINVAL: already gone with its directory.
            let _ = inotify::remove_watch(&self.fd, watch);
        }

        /// Hands every queued notice to `each`, oldest first; how many
        /// there were. A failed read is reported as [`Notice::Lost`].
        pub fn drain(&self, mut each: impl FnMut(Notice<'_>)) -> usize {
            // Room for at least one event with the longest name.
            let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
            let mut reader = inotify::Reader::new(self.fd.as_fd(), &mut buf);
            let mut taken = 0;
            loop {
                let event = match reader.next() {
                    Ok(event) => event,
                    Err(Errno::WOULDBLOCK) => return taken,
                    Err(Errno::INTR) => continue,
                    Err(e) => {
                        tracing::warn!("reading change notices: {e}");
                        each(Notice::Lost);
                        return taken + 1;
                    }
                };
                taken += 1;
                let flags = event.events();
                let watch = event.wd();
                if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                    each(Notice::Lost);
                } else if flags.contains(ReadFlags::IGNORED) {
                    each(Notice::Ended { watch });
                } else if let Some(name) = event.file_name().filter(|n| !n.is_empty()) {
                    each(Notice::Entry {
                        watch,
                        name: name.to_bytes(),
                    });
                } else {
                    each(Notice::Dir { watch });
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::*;

    impl Watcher {
        /// No change notices here (kqueue watches files one descriptor at a
        /// time): nothing is kept.
        pub fn new() -> Option<Watcher> {
            None
        }

        pub fn watch(&self, _dir: BorrowedFd<'_>) -> rustix::io::Result<WatchId> {
            Err(rustix::io::Errno::NOSYS)
        }

        pub fn unwatch(&self, _watch: WatchId) {}

        pub fn drain(&self, _each: impl FnMut(Notice<'_>)) -> usize {
            let _ = &self.fd;
            0
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn notices(w: &Watcher) -> Vec<String> {
        let mut seen = Vec::new();
        w.drain(|n| seen.push(format!("{n:?}")));
        seen
    }

    #[test]
    fn every_change_to_an_entry_is_queued_before_the_call_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path();
        std::fs::write(path.join("a"), b"1").unwrap();
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let w = Watcher::new().unwrap();
        let id = w.watch(fd.as_fd()).unwrap();
        assert_eq!(w.watch(fd.as_fd()).unwrap(), id, "one id per directory");
        assert!(notices(&w).is_empty());

        let entry = |name: &str| {
            format!(
                "{:?}",
                Notice::Entry {
                    watch: id,
                    name: name.as_bytes()
                }
            )
        };
        // A write through an open descriptor, a truncate, a chmod, a
        // rename, a new file, a removal: each is there as soon as it returns.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path.join("a"))
            .unwrap();
        f.write_all(b"2").unwrap();
        assert!(notices(&w).contains(&entry("a")), "write");
        f.set_len(0).unwrap();
        assert!(notices(&w).contains(&entry("a")), "truncate");
        std::fs::set_permissions(
            path.join("a"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        assert!(notices(&w).contains(&entry("a")), "chmod");
        std::fs::rename(path.join("a"), path.join("b")).unwrap();
        let seen = notices(&w);
        assert!(
            seen.contains(&entry("a")) && seen.contains(&entry("b")),
            "{seen:?}"
        );
        std::fs::write(path.join("c"), b"").unwrap();
        assert!(notices(&w).contains(&entry("c")), "create");
        std::fs::remove_file(path.join("c")).unwrap();
        assert!(notices(&w).contains(&entry("c")), "remove");
        assert!(notices(&w).is_empty(), "each notice is taken once");

        // The directory's own end, once nothing holds it open, ends its watch.
        drop(f);
        drop(fd);
        std::fs::remove_file(path.join("b")).unwrap();
        notices(&w);
        std::fs::remove_dir(path).unwrap();
        let seen = notices(&w);
        assert!(
            seen.contains(&format!("{:?}", Notice::Dir { watch: id })),
            "{seen:?}"
        );
        assert!(
            seen.contains(&format!("{:?}", Notice::Ended { watch: id })),
            "{seen:?}"
        );
        w.unwatch(id);
    }

    #[test]
    fn only_directories_are_watched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let f = std::fs::File::open(dir.path().join("f")).unwrap();
        let w = Watcher::new().unwrap();
        assert_eq!(w.watch(f.as_fd()), Err(rustix::io::Errno::NOTDIR));
    }
}
