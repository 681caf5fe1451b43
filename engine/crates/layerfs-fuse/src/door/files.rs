//! Files and data: OPEN, CREATE, READ, WRITE and RELEASE.

use layerfs_vfs::ReadSource;

use super::passthrough::PASSTHROUGH_FLAGS;
use super::*;

impl Door {
    pub(crate) fn open_as(&self, who: Who, ino: INodeNo, flags: OpenFlags, reply: impl OpenAnswer) {
        let caller = self.caller_of(who);
        let id = self.id(ino);
        // A file with no name left is opened again through /proc/PID/fd.
        let attr = match self.or_held(id, self.fs.getattr(id), |kept| held_attr(id, kept)) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(e)),
        };
        let wants = open_wants(flags);
        if !permits(&attr, &caller, wants) {
            return reply.error(Errno::EACCES);
        }
        let held = self.held(attr.fileid, wants.contains(Perm::WRITE));
        let kept = held.as_ref().map(|h| h.file.clone());
        // Writes through passthrough reach the host file without the door:
        // the copy-up this open made is made durable now, as such writes
        // promise.
        if wants.contains(Perm::WRITE) && flags.0 & libc::O_DSYNC != 0 {
            if let Err(e) = self.fs.commit(attr.fileid) {
                return reply.error(errno(e));
            }
        }
        self.opens.open(
            attr.fileid,
            held,
            reply,
            |_| self.backing(&caller, &attr, kept.as_ref(), wants.contains(Perm::WRITE)),
            |reply, way| match way {
                Way::Cached => reply.opened_as(CACHED, self.open_flags(), None),
                Way::Passthrough(b) => reply.opened_as(PASSTHROUGH, PASSTHROUGH_FLAGS, Some(b)),
            },
        );
    }

    pub(crate) fn read_as(&self, ino: INodeNo, offset: u64, size: u32, reply: impl DataAnswer) {
        let id = self.id(ino);
        READ_BUF.with_borrow_mut(|buf| {
            buf.clear();
            let read = self
                .fs
                .read(&Caller::root(), id, offset, size as usize, buf);
            let read = self.or_held(id, read, |kept| {
                buf.clear();
                kept.read(offset, size as usize, buf)
            });
            match read {
                Ok(_) => reply.data(buf),
                Err(e) => reply.error(errno(e)),
            }
        })
    }

    /// Where the bytes of a READ of `size` at `offset` of `ino` lie on the
    /// host: one range of one host file, for an answer to take them from
    /// there. None where the filesystem names none, for [`Door::read_as`].
    pub(crate) fn read_source(&self, ino: INodeNo, offset: u64, size: usize) -> Option<ReadSource> {
        let source = self
            .fs
            .host_files()?
            .read_source(&Caller::root(), self.id(ino), offset, size);
        match source {
            Ok(Some(source)) => Some(source),
            // Stale (a file open with no name left): read_as reads the
            // file its opens hold.
            Ok(None) | Err(_) => None,
        }
    }

    /// Reads into `dst` straight from the host file the filesystem names
    /// for `ino`, the buffer the answer is written from: the READ's one
    /// copy. None where it names none, for [`Door::read_as`].
    pub(crate) fn read_into(
        &self,
        ino: INodeNo,
        offset: u64,
        dst: &mut [u8],
    ) -> Option<Result<usize, Errno>> {
        let source = self.read_source(ino, offset, dst.len())?;
        Some(read_from(&source, dst))
    }
}

/// Reads `source`'s bytes into `dst`, which holds them: fewer where the
/// file has shrunk since.
pub(crate) fn read_from(source: &ReadSource, dst: &mut [u8]) -> Result<usize, Errno> {
    let mut done = 0;
    while done < source.len {
        let at = source.offset + done as u64;
        match rustix::io::pread(&*source.file, &mut dst[done..source.len], at) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(errno(Error::from(std::io::Error::from(e)))),
        }
    }
    Ok(done)
}

impl Door {
    pub(crate) fn write_as(
        &self,
        ino: INodeNo,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        reply: impl WriteAnswer,
    ) {
        let id = self.id(ino);
        // Usually done already, by the SETATTR before it; not where the
        // kernel took the file for one without either bit. Its cached mode
        // is then wrong: it forgets it (only the attributes: the writer
        // holds the pages this write is from).
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            match self.drop_privilege(id) {
                Ok(false) => {}
                Ok(true) => {
                    if let Some(connection) = &self.connection {
                        let _ = connection.forget_inode(ino.0, false);
                    }
                }
                Err(e) => return reply.error(errno(e)),
            }
        }
        let stable = if flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0 {
            Stability::FileSync
        } else {
            Stability::Unstable
        };
        let written = self
            .fs
            .write(&Caller::root(), id, offset, data, stable)
            .map(drop);
        match self.or_held_to_change(id, written, |file| {
            hostdir::write_at(file, offset, data, stable)
        }) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    pub(crate) fn release_as(&self, ino: INodeNo, fh: FileHandle, reply: impl EmptyAnswer) {
        // Answered first: the release is counted once it is (see
        // [`crate::open_table`]).
        reply.ok();
        let id = self.id(ino);
        if self.opens.release(id, fh) {
            self.forget_removed(id);
        }
    }

    pub(crate) fn create_as(
        &self,
        who: Who,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
        flags: i32,
        reply: impl CreateAnswer,
    ) {
        let set = with_mode(mode);
        let exclusive = flags & libc::O_EXCL != 0;
        let how = if exclusive {
            Create::Guarded(set)
        } else {
            Create::Unchecked(set)
        };
        let caller = self.caller_of(who);
        let attr = match self.fs.create(&caller, self.id(parent), name, how) {
            Ok((attr, _)) => attr,
            Err(e) => return reply.error(errno(e)),
        };
        // A file just made has no capability: the kernel's question before
        // its first write is answered without asking the host.
        if exclusive {
            self.no_caps.found_none(self.inos.ino(attr.fileid));
        }
        let (ttl, fattr, generation) = (
            self.caching.ttl(),
            self.inos.attr(&attr),
            Generation(attr.generation),
        );
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let held = self.held(attr.fileid, write);
        let kept = held.as_ref().map(|h| h.file.clone());
        self.opens.open(
            attr.fileid,
            held,
            reply,
            |_| self.backing(&caller, &attr, kept.as_ref(), write),
            |reply, way| {
                let (fh, flags, backing) = match way {
                    Way::Cached => (CACHED, self.open_flags(), None),
                    Way::Passthrough(b) => (PASSTHROUGH, PASSTHROUGH_FLAGS, Some(b)),
                };
                reply.created_as(&ttl, &fattr, generation, fh, flags, backing)
            },
        );
    }

    /// FLUSH: writes are already in the host's page cache, so a close
    /// needs nothing more, as on a local filesystem (fsync makes them
    /// durable). Said once with ENOSYS, after which the kernel sends no
    /// FLUSH at a close (dirty pages of its writeback cache it still
    /// writes first): one round trip less per close of a file.
    pub(crate) fn flush_as(&self, reply: impl Answer) {
        reply.error(Errno::ENOSYS)
    }

    /// IOCTL: no file here answers one. ENOTTY is the kernel's own answer
    /// for a regular file (a program's isatty() asks with TCGETS on every
    /// open), without a warning in the log for each.
    pub(crate) fn ioctl_as(&self, reply: impl Answer) {
        reply.error(Errno::ENOTTY)
    }

    pub(crate) fn fsync_as(&self, ino: INodeNo, datasync: bool, reply: impl EmptyAnswer) {
        let id = self.id(ino);
        let committed = self.fs.commit(id).map(drop);
        done(
            reply,
            self.or_held(id, committed, |kept| kept.sync(datasync)),
        )
    }

    /// The modes of fallocate(2) the filesystem offers; others (zero,
    /// collapse or insert a range) are EOPNOTSUPP, and `posix_fallocate`
    /// falls back to writing.
    pub(crate) fn fallocate_as(
        &self,
        ino: INodeNo,
        (offset, length): (u64, u64),
        mode: i32,
        reply: impl EmptyAnswer,
    ) {
        let how = match mode {
            0 => Allocate::Extend,
            libc::FALLOC_FL_KEEP_SIZE => Allocate::KeepSize,
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => Allocate::PunchHole,
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        let id = self.id(ino);
        let done_here = self.fs.allocate(id, offset, length, how).map(drop);
        done(
            reply,
            self.or_held_to_change(id, done_here, |file| {
                hostdir::allocate(file, offset, length, how)
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{ask, door, entry, me, Got, ROOT};
    use super::*;

    #[test]
    fn a_file_is_created_written_synced_read_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let d = door(dir.path(), Caching::Shared);
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        let made = ask(|r| d.create_as(me(), ROOT, b"new", 0o100640, flags, r));
        let Got::Created(attr, fh) = made else {
            panic!("not created: {made:?}")
        };
        assert_eq!(attr.perm, 0o640);
        let again = ask(|r| d.create_as(me(), ROOT, b"new", 0o100640, flags, r));
        assert_eq!(again, Got::Error(Errno::from_i32(libc::EEXIST)), "O_EXCL");

        let rw = OpenFlags(libc::O_RDWR);
        let written = ask(|r| d.write_as(attr.ino, 0, b"hello", WriteFlags::empty(), rw, r));
        assert_eq!(written, Got::Written(5));
        assert_eq!(ask(|r| d.fsync_as(attr.ino, true, r)), Got::Ok);
        assert_eq!(ask(|r| d.fsync_as(attr.ino, false, r)), Got::Ok);
        assert_eq!(std::fs::read(dir.path().join("new")).unwrap(), b"hello");
        assert_eq!(
            ask(|r| d.read_as(attr.ino, 1, 100, r)),
            Got::Data(b"ello".to_vec())
        );
        assert_eq!(ask(|r| d.release_as(attr.ino, fh, r)), Got::Ok);
        let opened = ask(|r| d.open_as(me(), attr.ino, OpenFlags(libc::O_RDONLY), r));
        assert!(matches!(opened, Got::Opened(_)), "{opened:?}");
    }

    #[test]
    fn fallocate_extends_keeps_the_size_or_punches_and_refuses_other_modes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 8192]).unwrap();
        let d = door(dir.path(), Caching::Shared);
        let f = entry(ask(|r| d.lookup_as(me(), ROOT, b"f", r)));
        let size = || std::fs::metadata(dir.path().join("f")).unwrap().len();
        assert_eq!(ask(|r| d.fallocate_as(f.ino, (0, 16384), 0, r)), Got::Ok);
        assert_eq!(size(), 16384, "extended");
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        assert_eq!(ask(|r| d.fallocate_as(f.ino, (0, 65536), keep, r)), Got::Ok);
        assert_eq!(size(), 16384, "the size kept");
        let punch = libc::FALLOC_FL_PUNCH_HOLE | keep;
        match ask(|r| d.fallocate_as(f.ino, (0, 4096), punch, r)) {
            Got::Ok => {
                let data = std::fs::read(dir.path().join("f")).unwrap();
                assert!(data[..4096].iter().all(|&b| b == 0), "the hole reads zeros");
                assert_eq!(data[4096], 7);
            }
            // A host filesystem without holes.
            Got::Error(e) => assert_eq!(e, Errno::EOPNOTSUPP),
            other => panic!("{other:?}"),
        }
        let zero = libc::FALLOC_FL_ZERO_RANGE;
        let refused = ask(|r| d.fallocate_as(f.ino, (0, 4096), zero, r));
        assert_eq!(refused, Got::Error(Errno::EOPNOTSUPP));
        assert_eq!(size(), 16384);
    }
}
