//! Passthrough and backing: which opens the kernel may read and write
//! through a host file registered with it, and the privilege a user's
//! door lets go of to hold one.

use std::os::fd::BorrowedFd;

use super::*;

/// Open flags beside FOPEN_PASSTHROUGH: the kernel writes the host file
/// itself, so a close has nothing to flush through the door.
pub(super) const PASSTHROUGH_FLAGS: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

impl Door {
    /// Registers the host file of the file `attr` describes with the
    /// kernel, where the filesystem has one and handing it out is safe:
    /// `kept`, the file this open holds, where the filesystem says it is
    /// that host file (the door checked the open itself).
    pub(super) fn backing(
        &self,
        caller: &Caller,
        attr: &Attr,
        kept: Option<&KeptFile>,
        write: bool,
    ) -> Option<Backing> {
        // A write to a file with setuid or setgid comes to the door, which
        // clears them as the kernel asks (see [`crate::privilege`]).
        if !self.passthrough || attr.kind != FileKind::Regular || attr.mode & 0o6000 != 0 {
            return None;
        }
        let device = self.connection.as_ref()?.device();
        let files = self.fs.host_files()?;
        let fd = match kept {
            Some(kept) if files.kept_is_host_file(attr.fileid, kept, write) => {
                kept.whole_host()?.clone()
            }
            _ => files.host_file(caller, attr.fileid, write).ok()??,
        };
        let registered = match self.caching {
            Caching::Shared => privilege::without_fsetid(|| Backing::register(device, fd.as_fd())),
            Caching::Exclusive => Backing::register(device, fd.as_fd()),
        };
        match registered {
            Ok(backing) => Some(backing),
            Err(e) => {
                tracing::debug!("no passthrough for file {}: {e}", attr.fileid);
                None
            }
        }
    }

    /// Clears setuid, and setgid with group execute, of file `id`, as a
    /// write by a caller without `CAP_FSETID` does before it writes; says
    /// whether there were any.
    pub(super) fn drop_privilege(&self, id: FileId) -> layerfs_vfs::Result<bool> {
        let attr = self.or_held(id, self.fs.getattr(id), |kept| held_attr(id, kept))?;
        let Some(mode) = hostdir::mode_without_privilege(&attr) else {
            return Ok(false);
        };
        let set = SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        let changed = self.fs.setattr(&Caller::root(), id, &set, None).map(drop);
        self.or_held_to_change(id, changed, |file| {
            Ok(rustix::fs::fchmod(file, hostdir::permissions(mode))?)
        })?;
        Ok(true)
    }

    /// What an open of `id` (for writing with `write`) holds until its
    /// release (see [`crate::opens`]). The open goes on without it where
    /// the filesystem cannot give it: a write to come then meets the same
    /// failure (a copy-up into a full upper, say) and reports it.
    pub(super) fn held(&self, id: FileId, write: bool) -> Option<Held> {
        match self.fs.host_files()?.file_to_keep(id, write) {
            Ok(file) => file.map(|file| Held { file, write }),
            Err(e) => {
                tracing::debug!("file {id} is opened without holding its host file: {e}");
                None
            }
        }
    }

    /// `result`, unless it is `Stale` for a file still open: the file lost
    /// its last name while a process held it, and `on_held` answers from the
    /// host file its opens hold, as a local filesystem would.
    pub(super) fn or_held<T>(
        &self,
        id: FileId,
        result: layerfs_vfs::Result<T>,
        on_held: impl FnOnce(&KeptFile) -> layerfs_vfs::Result<T>,
    ) -> layerfs_vfs::Result<T> {
        match result {
            Err(Error::Stale) => match self.opens.held(id) {
                Some(held) => on_held(&held.file),
                None => Err(Error::Stale),
            },
            other => other,
        }
    }

    /// [`or_held`](Self::or_held) for a change, made through the held
    /// file's descriptor: there is one only for a file taken for writing
    /// (the upper's, which holds all its data).
    pub(super) fn or_held_to_change<T>(
        &self,
        id: FileId,
        result: layerfs_vfs::Result<T>,
        on_held: impl FnOnce(BorrowedFd<'_>) -> layerfs_vfs::Result<T>,
    ) -> layerfs_vfs::Result<T> {
        match result {
            Err(Error::Stale) => match self.opens.held(id).filter(|h| h.write) {
                Some(held) => on_held(held.file.whole_host().ok_or(Error::RoFs)?.as_fd()),
                None => Err(Error::Stale),
            },
            other => other,
        }
    }

    /// How the kernel may cache an open file's pages.
    pub(super) fn open_flags(&self) -> FopenFlags {
        match self.caching {
            // Nothing changes a file behind the door: pages cached by an
            // earlier open are still the file's.
            Caching::Exclusive => FopenFlags::FOPEN_KEEP_CACHE,
            Caching::Shared => FopenFlags::empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::super::testing::{ask, door, entry, me, Got, ROOT};
    use super::*;

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn setuid_and_setgid_with_group_execute_are_dropped_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = door(dir.path(), Caching::Shared);
        // (mode before, mode after): setgid without group execute marks
        // mandatory locking, not privilege, and stays.
        for (i, (before, after)) in [
            (0o4755, 0o755),
            (0o2750, 0o750),
            (0o6775, 0o775),
            (0o2740, 0o2740),
            (0o644, 0o644),
        ]
        .into_iter()
        .enumerate()
        {
            let name = format!("f{i}");
            let path = dir.path().join(&name);
            std::fs::write(&path, b"x").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(before)).unwrap();
            let f = entry(ask(|r| d.lookup_as(me(), ROOT, name.as_bytes(), r)));
            let dropped = d.drop_privilege(d.id(f.ino)).unwrap();
            assert_eq!(
                (dropped, mode(&path)),
                (before != after, after),
                "{before:o}"
            );
            assert!(!d.drop_privilege(d.id(f.ino)).unwrap(), "{before:o} again");
        }
    }

    #[test]
    fn a_file_open_with_no_name_left_is_answered_from_what_its_open_holds() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"kept").unwrap();
        let d = door(dir.path(), Caching::Shared);
        let f = entry(ask(|r| d.lookup_as(me(), ROOT, b"f", r)));
        let Got::Opened(fh) = ask(|r| d.open_as(me(), f.ino, OpenFlags(libc::O_RDWR), r)) else {
            panic!("not opened")
        };
        assert_eq!(ask(|r| d.unlink_as(me(), ROOT, b"f", r)), Got::Ok);
        assert!(!dir.path().join("f").exists());
        let rw = OpenFlags(libc::O_RDWR);
        let written = ask(|r| d.write_as(f.ino, 4, b"!", WriteFlags::empty(), rw, r));
        assert_eq!(
            written,
            Got::Written(1),
            "written to the file the open holds"
        );
        assert_eq!(
            ask(|r| d.read_as(f.ino, 0, 100, r)),
            Got::Data(b"kept!".to_vec())
        );
        let Got::Attr(attr) = ask(|r| d.getattr_as(f.ino, r)) else {
            panic!("no attributes")
        };
        assert_eq!((attr.size, attr.nlink), (5, 0));
        assert_eq!(ask(|r| d.release_as(f.ino, fh, r)), Got::Ok);
        assert!(matches!(
            ask(|r| d.read_as(f.ino, 0, 100, r)),
            Got::Error(_)
        ));
    }
}
