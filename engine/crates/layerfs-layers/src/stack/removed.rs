//! Files removed while a door's opens hold them, kept for the next server.
//!
//! A process goes on using a file it holds open after its last name is
//! removed; a FUSE door keeps the host file open for that
//! ([`HostFiles::file_to_keep`](layerfs_vfs::HostFiles::file_to_keep)).
//! The kernel's opens outlive the door's process, though: a daemon killed
//! or upgraded leaves its sessions to the next one, and the descriptor dies
//! with it. So a removal that takes a regular file's last name asks the
//! door's [`Holder`] first, and links what its opens hold here, in
//! `state/removed/`, named by its id: `<id>` for a file held for writing,
//! `<id>.read` for one held only for reading (which may be a lower
//! layer's, and is never opened for writing). A removal of a file no open
//! holds costs one look in the door's table. The next server opens them
//! again, and each link goes with the file's last release, or when a
//! server starts with no open of it left.
//!
//! Only the daemon's process ending is outlived: a link is not synced, as
//! the kernel's opens do not outlive the host.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use layerfs_vfs::{Attr, FileId, FileKind, Holder, KeptFile, RemovedFile};
use parking_lot::RwLock;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

/// The suffix of a file held only for reading.
const READ_ONLY: &str = ".read";

/// `state/removed/`, open, and whom to ask what to keep there.
pub struct Removed {
    dir: OwnedFd,
    holder: RwLock<Option<Arc<dyn Holder>>>,
}

impl Removed {
    /// The directory in `state` (made if missing), on the upper's filesystem
    /// as a link must be.
    pub fn open(state: &Path) -> io::Result<Removed> {
        let path = state.join("removed");
        match std::fs::create_dir(&path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let dir = rustix::fs::open(
            &path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        Ok(Removed {
            dir,
            holder: RwLock::new(None),
        })
    }

    /// Asks `holder` from now ([`Removed::before_removal`]).
    pub fn hold_for(&self, holder: Arc<dyn Holder>) {
        *self.holder.write() = Some(holder);
    }

    /// Before the name of the file `attr` describes is removed: where it is
    /// the file's last, keeps what the holder's opens hold of it. A file
    /// that cannot be kept is said in the log, and removed all the same.
    pub fn before_removal(&self, attr: &Attr) {
        if attr.kind != FileKind::Regular || attr.nlink > 1 {
            return;
        }
        let Some(holder) = &*self.holder.read() else {
            return;
        };
        let Some((file, write)) = holder.keep(attr.fileid) else {
            return;
        };
        if let Err(e) = self.keep(attr.fileid, &file, write) {
            tracing::warn!(
                "file {}, open and losing its last name, is not kept for a next server \
                 ({e}): after a restart its opens are stale",
                attr.fileid
            );
        }
    }

    /// Links `file`, open for the opens of `id`, here; a link left for the
    /// same id by a removal that failed is replaced.
    pub fn keep(&self, id: FileId, file: &KeptFile, write: bool) -> io::Result<()> {
        self.forget(id)?;
        file.link_into(self.dir.as_fd(), &name(id, write))
    }

    /// Every file kept here, opened again and made a [`KeptFile`] by
    /// `keep` (told whether it was held for writing); a name that is no
    /// kept file's is removed.
    pub fn kept(
        &self,
        keep: impl Fn(Arc<OwnedFd>, bool) -> KeptFile,
    ) -> io::Result<Vec<RemovedFile>> {
        let mut kept = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let (digits, write) = match name.strip_suffix(READ_ONLY) {
                Some(digits) => (digits, false),
                None => (name.as_str(), true),
            };
            let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
            let opened = digits.parse::<FileId>().ok().map(|id| {
                let flags = access | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY;
                rustix::fs::openat(&self.dir, &name, flags, Mode::empty()).map(|file| (id, file))
            });
            match opened {
                Some(Ok((id, file))) => kept.push(RemovedFile {
                    id,
                    file: keep(Arc::new(file), write),
                    write,
                }),
                Some(Err(e)) => {
                    tracing::warn!("{name}, kept removed, cannot be opened again: {e}");
                    remove(self.dir.as_fd(), &name)?;
                }
                None => remove(self.dir.as_fd(), &name)?,
            }
        }
        Ok(kept)
    }

    /// Removes what is kept for `id`, if anything.
    pub fn forget(&self, id: FileId) -> io::Result<()> {
        for write in [true, false] {
            remove(self.dir.as_fd(), &name(id, write))?;
        }
        Ok(())
    }
}

fn name(id: FileId, write: bool) -> String {
    if write {
        id.to_string()
    } else {
        format!("{id}{READ_ONLY}")
    }
}

/// Removes `name` from `dir`; one that is not there is no error.
fn remove(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(kept: KeptFile) -> std::fs::File {
        std::fs::File::from(kept.whole_host().unwrap().try_clone().unwrap())
    }
    use std::io::{Read, Seek, Write};

    fn kept(file: &std::fs::File) -> KeptFile {
        KeptFile::whole(Arc::new(file.try_clone().unwrap().into()))
    }

    fn removed_file(dir: &Path, name: &str, bytes: &[u8]) -> std::fs::File {
        let path = dir.join(name);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.write_all(bytes).unwrap();
        file
    }

    fn contents(mut file: &std::fs::File) -> Vec<u8> {
        let mut bytes = Vec::new();
        file.rewind().unwrap();
        file.read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn a_file_kept_before_its_name_goes_is_opened_again_the_way_it_was_held() {
        let dir = tempfile::tempdir().unwrap();
        let removed = Removed::open(dir.path()).unwrap();
        let written = removed_file(dir.path(), "written", b"w");
        let read = removed_file(dir.path(), "read", b"r");
        removed.keep(7, &kept(&written), true).unwrap();
        removed.keep(8, &kept(&read), false).unwrap();
        std::fs::remove_file(dir.path().join("written")).unwrap();
        std::fs::remove_file(dir.path().join("read")).unwrap();
        drop((written, read));

        // A server that starts again, as after a crash.
        let again = Removed::open(dir.path()).unwrap();
        let mut kept = again.kept(|fd, _| KeptFile::whole(fd)).unwrap();
        kept.sort_by_key(|k| k.id);
        let seen: Vec<_> = kept.iter().map(|k| (k.id, k.write)).collect();
        assert_eq!(seen, [(7, true), (8, false)]);
        let file = file_of(kept.remove(0).file);
        assert_eq!(contents(&file), b"w");
        (&file).write_all(b"ritten").unwrap();
        assert_eq!(contents(&file), b"written", "opened for writing");
        let read_only = file_of(kept.remove(0).file);
        assert_eq!(contents(&read_only), b"r");
        assert!(
            (&read_only).write_all(b"x").is_err(),
            "opened for reading alone"
        );

        // Kept until forgotten, then gone.
        assert_eq!(again.kept(|fd, _| KeptFile::whole(fd)).unwrap().len(), 2);
        again.forget(7).unwrap();
        again.forget(8).unwrap();
        again.forget(9).unwrap();
        assert!(again.kept(|fd, _| KeptFile::whole(fd)).unwrap().is_empty());
        assert_eq!(
            std::fs::read_dir(dir.path().join("removed"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn a_second_keep_replaces_the_first_and_stray_names_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let removed = Removed::open(dir.path()).unwrap();
        let first = removed_file(dir.path(), "first", b"first");
        let second = removed_file(dir.path(), "second", b"second");
        removed.keep(3, &kept(&first), false).unwrap();
        removed.keep(3, &kept(&second), true).unwrap();
        std::fs::write(dir.path().join("removed/not-an-id"), b"").unwrap();
        let kept = removed.kept(|fd, _| KeptFile::whole(fd)).unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!((kept[0].id, kept[0].write), (3, true));
        assert_eq!(
            contents(&file_of(kept.into_iter().next().unwrap().file)),
            b"second"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path().join("removed"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["3"]);
    }
}
