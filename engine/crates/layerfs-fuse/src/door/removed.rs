//! Files removed while open, across a change of server.
//!
//! The door serves a file whose last name is gone from the host file its
//! opens hold ([`crate::opens`]). The kernel's opens outlive the door's
//! process (a crash, an upgrade: [`crate::handover`]), the descriptor does
//! not. So the filesystem asks the door's opens, before a removal takes a
//! regular file's last name, what they hold of it, and keeps that
//! ([`HostFiles::hold_removed_for`]); a server that starts holds again what
//! the last one kept for the opens the session still has, and lets go of
//! the rest; the last release lets go.

use layerfs_vfs::RemovedFile;

use super::*;

impl Door {
    /// At the start of a session: what the last server had the filesystem
    /// keep is held again for the opens still recorded, and let go where
    /// none is (all of it, for a session mounted afresh); what this door's
    /// opens hold is kept from now.
    pub(crate) fn adopt_removed(&self) {
        let Some(files) = self.fs.host_files() else {
            return;
        };
        files.hold_removed_for(self.opens.clone());
        let kept = match files.kept_removed() {
            Ok(kept) => kept,
            Err(e) => {
                return tracing::warn!("files removed while open cannot be read back: {e}");
            }
        };
        let mut adopted = 0;
        for RemovedFile { id, file, write } in kept {
            let held = Held { file, write };
            if self.opens.hold_removed(id, held) {
                adopted += 1;
            } else {
                self.forget_removed(id);
            }
        }
        if adopted > 0 {
            tracing::info!(adopted, "files removed while open, held again");
        }
    }

    /// Has the filesystem let go of the file kept for `id`.
    pub(super) fn forget_removed(&self, id: FileId) {
        let Some(files) = self.fs.host_files() else {
            return;
        };
        if let Err(e) = files.forget_removed(id) {
            tracing::warn!("file {id}, removed while open, is still kept after its release: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;
    use std::path::{Path, PathBuf};

    use layerfs_layers::StackFs;

    use super::super::testing::{ask, entry, me, Got, ROOT};
    use super::*;
    use crate::open_table::OpenTable;

    /// A door over a one-layer stack in `dir` whose opens are recorded in a
    /// table: the table's descriptor, as a keeper holds it, or none for a
    /// door that starts afresh.
    fn stack_door(dir: &Path, opens: Option<OwnedFd>) -> (Door, OwnedFd) {
        let fs = StackFs::open(&[dir.join("lower")], &dir.join("upper"), &dir.join("state"));
        let door = Door::new(Arc::new(fs.unwrap()), Caching::Shared);
        let (opens, fd) = match opens {
            Some(fd) => {
                let (table, rows) = OpenTable::adopt(fd).unwrap();
                let fd = table.fd().try_clone_to_owned().unwrap();
                let opens = OpenFiles::resume(table, rows, |_| unreachable!("none passed through"));
                (opens, fd)
            }
            None => {
                let table = OpenTable::new().unwrap();
                let fd = table.fd().try_clone_to_owned().unwrap();
                (OpenFiles::default().with_table(table), fd)
            }
        };
        let door = door.with_open_files(opens);
        door.adopt_removed();
        (door, fd)
    }

    fn kept(dir: &Path) -> Vec<PathBuf> {
        let kept = std::fs::read_dir(dir.join("state/removed")).unwrap();
        kept.map(|e| e.unwrap().path()).collect()
    }

    #[test]
    fn a_file_open_when_its_last_name_goes_is_used_again_by_the_next_server() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("lower")).unwrap();
        std::fs::create_dir_all(dir.path().join("upper")).unwrap();
        for name in ["open", "closed", "linked"] {
            std::fs::write(dir.path().join("upper").join(name), b"kept").unwrap();
        }
        std::fs::hard_link(
            dir.path().join("upper/linked"),
            dir.path().join("upper/link"),
        )
        .unwrap();
        let (d, table) = stack_door(dir.path(), None);
        let rw = OpenFlags(libc::O_RDWR);
        let mut opened = Vec::new();
        for name in [&b"open"[..], b"linked"] {
            let f = entry(ask(|r| d.lookup_as(me(), ROOT, name, r)));
            let Got::Opened(fh) = ask(|r| d.open_as(me(), f.ino, rw, r)) else {
                panic!("not opened")
            };
            opened.push((f.ino, fh));
        }
        let (ino, fh) = opened[0];
        for name in [&b"open"[..], b"closed", b"linked"] {
            assert_eq!(ask(|r| d.unlink_as(me(), ROOT, name, r)), Got::Ok);
        }
        assert_eq!(
            kept(dir.path()).len(),
            1,
            "only the open file lost its last name"
        );

        // The door's process ends with the file open; the next one takes
        // the session, as after a crash.
        drop(d);
        let (d, _) = stack_door(dir.path(), Some(table));
        let written = ask(|r| d.write_as(ino, 4, b"!", WriteFlags::empty(), rw, r));
        assert_eq!(written, Got::Written(1));
        assert_eq!(
            ask(|r| d.read_as(ino, 0, 100, r)),
            Got::Data(b"kept!".to_vec())
        );
        let Got::Attr(attr) = ask(|r| d.getattr_as(ino, r)) else {
            panic!("no attributes")
        };
        assert_eq!((attr.size, attr.nlink), (5, 0));
        assert_eq!(
            ask(|r| d.lookup_as(me(), ROOT, b"open", r)),
            Got::Error(Errno::from_i32(libc::ENOENT))
        );

        // The last release lets go of it.
        assert_eq!(ask(|r| d.release_as(ino, fh, r)), Got::Ok);
        assert!(kept(dir.path()).is_empty());
        assert!(matches!(ask(|r| d.read_as(ino, 0, 100, r)), Got::Error(_)));
    }

    #[test]
    fn a_server_that_starts_afresh_lets_go_of_what_was_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("lower")).unwrap();
        std::fs::create_dir_all(dir.path().join("upper")).unwrap();
        std::fs::write(dir.path().join("upper/f"), b"kept").unwrap();
        let (d, _) = stack_door(dir.path(), None);
        let f = entry(ask(|r| d.lookup_as(me(), ROOT, b"f", r)));
        let rd = OpenFlags(libc::O_RDONLY);
        assert!(matches!(
            ask(|r| d.open_as(me(), f.ino, rd, r)),
            Got::Opened(_)
        ));
        // A RENAME over the open file takes its last name too.
        std::fs::write(dir.path().join("upper/g"), b"new").unwrap();
        assert_eq!(
            ask(|r| d.rename_as(me(), (ROOT, b"g"), (ROOT, b"f"), RenameFlags::empty(), r)),
            Got::Ok
        );
        assert_eq!(kept(dir.path()).len(), 1);
        // The mount went with the process (no table taken over).
        drop(d);
        let (_d, _) = stack_door(dir.path(), None);
        assert!(kept(dir.path()).is_empty());
    }
}
