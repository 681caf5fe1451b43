//! Entries and attributes: LOOKUP, GETATTR, SETATTR, UNLINK, ACCESS and
//! STATFS.

use super::*;

impl Door {
    pub(crate) fn lookup_as(
        &self,
        who: Who,
        parent: INodeNo,
        name: &[u8],
        reply: impl EntryAnswer,
    ) {
        let result = self.fs.lookup(&self.caller_of(who), self.id(parent), name);
        match (result, self.caching) {
            // Where nothing changes behind the door, a missing name is
            // remembered too (until this door creates it): compilers and
            // shells look up many names that are not there.
            (Err(Error::NoEnt), Caching::Exclusive) => {
                // Inode 0 makes it negative; the kernel ignores the rest.
                let mut none = self.inos.attr(&Attr::blank(FileKind::Regular));
                none.ino = INodeNo(0);
                reply.entry(&self.caching.ttl(), &none, Generation(0));
            }
            (result, _) => self.entry(reply, result),
        }
    }

    pub(crate) fn getattr_as(&self, ino: INodeNo, reply: impl AttrAnswer) {
        let id = self.id(ino);
        match self.or_held(id, self.fs.getattr(id), |file| held_attr(id, file)) {
            Ok(a) => reply.attr(&self.caching.ttl(), &self.inos.attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// SETATTR of `set` (its mode's permission bits only: the kernel
    /// sends the file type too).
    pub(crate) fn setattr_as(&self, who: Who, ino: INodeNo, set: SetAttr, reply: impl AttrAnswer) {
        let set = SetAttr {
            mode: set.mode.map(|m| m & 0o7777),
            ..set
        };
        let caller = self.caller_of(who);
        let id = self.id(ino);
        // A SETATTR of nothing is the kernel's before a write by a caller
        // without CAP_FSETID to a file with setuid, setgid or capabilities
        // (it leaves out the mode it would set: see [`crate::privilege`]).
        if set.is_empty() {
            if let Err(e) = self.drop_privilege(id) {
                return reply.error(errno(e));
            }
        }
        let result = self
            .fs
            .setattr(&caller, id, &set, None)
            .and_then(|c| self.after(id, c.after));
        // A file with no name left is still changed through an open
        // (ftruncate, fchmod, the kernel's writeback setting times).
        let result = self.or_held_to_change(id, result, |file| {
            let held = |file| shown_held(id, hostdir::host_attr(file)?);
            let set = hostdir::check_setattr(&caller, &held(file)?, &set)?;
            if let Some(size) = set.size {
                rustix::fs::ftruncate(file, size)?;
            }
            if set.uid.is_some() || set.gid.is_some() {
                let (uid, gid) = (set.uid.map(Uid::from_raw), set.gid.map(Gid::from_raw));
                rustix::fs::fchown(file, uid, gid)?;
            }
            if let Some(mode) = set.mode {
                rustix::fs::fchmod(file, hostdir::permissions(mode))?;
            }
            if let Some(times) = hostdir::timestamps(&set) {
                rustix::fs::futimens(file, &times)?;
            }
            held(file)
        });
        match result {
            Ok(a) => reply.attr(&self.caching.ttl(), &self.inos.attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    pub(crate) fn unlink_as(
        &self,
        who: Who,
        parent: INodeNo,
        name: &[u8],
        reply: impl EmptyAnswer,
    ) {
        done(
            reply,
            self.fs.remove(&self.caller_of(who), self.id(parent), name),
        )
    }

    /// ACCESS: what the caller `wants` of the file, as its mode allows.
    pub(crate) fn access_as(&self, who: Who, ino: INodeNo, wants: Perm, reply: impl EmptyAnswer) {
        match self.fs.getattr(self.id(ino)) {
            Ok(attr) if permits(&attr, &self.caller_of(who), wants) => reply.ok(),
            Ok(_) => reply.error(Errno::EACCES),
            Err(e) => reply.error(errno(e)),
        }
    }

    pub(crate) fn statfs_as(&self, ino: INodeNo, reply: impl StatfsAnswer) {
        const BLOCK: u64 = 4096;
        match self.fs.fsstat(self.id(ino)) {
            Ok(s) => reply.statfs(Statfs {
                blocks: s.total_bytes / BLOCK,
                free: s.free_bytes / BLOCK,
                available: s.avail_bytes / BLOCK,
                files: s.total_files,
                free_files: s.free_files,
                block: BLOCK as u32,
                name_max: layerfs_vfs::NAME_MAX as u32,
            }),
            Err(e) => reply.error(errno(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::super::testing::{ask, door, entry, me, Got, ROOT};
    use super::*;

    #[test]
    fn a_name_is_looked_up_its_attributes_set_and_it_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello world").unwrap();
        let d = door(dir.path(), Caching::Shared);
        let f = entry(ask(|r| d.lookup_as(me(), ROOT, b"f", r)));
        assert_eq!(f.size, 11);
        let missing = ask(|r| d.lookup_as(me(), ROOT, b"none", r));
        assert_eq!(missing, Got::Error(Errno::from_i32(libc::ENOENT)));
        // Where nothing changes behind the door, a negative entry instead.
        let alone = door(dir.path(), Caching::Exclusive);
        let negative = entry(ask(|r| alone.lookup_as(me(), ROOT, b"none", r)));
        assert_eq!(negative.ino, INodeNo(0));

        // The kernel sends the file type with the mode: only the
        // permission bits are set.
        let set = SetAttr {
            mode: Some(libc::S_IFREG | 0o4600),
            size: Some(5),
            ..SetAttr::default()
        };
        let after = entry(ask(|r| d.setattr_as(me(), f.ino, set, r)));
        assert_eq!((after.perm, after.size), (0o4600, 5));
        let host = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(
            (host.permissions().mode() & 0o7777, host.len()),
            (0o4600, 5)
        );
        assert_eq!(entry(ask(|r| d.getattr_as(f.ino, r))), after);

        assert_eq!(ask(|r| d.unlink_as(me(), ROOT, b"f", r)), Got::Ok);
        assert!(!dir.path().join("f").exists());
        let again = ask(|r| d.unlink_as(me(), ROOT, b"f", r));
        assert_eq!(again, Got::Error(Errno::from_i32(libc::ENOENT)));
    }

    #[test]
    fn access_is_what_the_mode_allows_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        std::fs::set_permissions(dir.path().join("f"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        let d = door(dir.path(), Caching::Shared);
        let f = entry(ask(|r| d.lookup_as(me(), ROOT, b"f", r)));
        // Pid 0 (a request of the kernel's own): no supplementary groups
        // are read, so the test's own do not count.
        let owner = Who {
            uid: f.uid,
            gid: f.gid,
            pid: 0,
        };
        let other = Who {
            uid: f.uid + 4242,
            gid: f.gid + 4242,
            pid: 0,
        };
        let may = |who: Who, wants: Perm| ask(|r| d.access_as(who, f.ino, wants, r));
        assert_eq!(may(owner, Perm::READ | Perm::WRITE), Got::Ok);
        assert_eq!(may(owner, Perm::EXEC), Got::Error(Errno::EACCES));
        assert_eq!(may(other, Perm::READ), Got::Error(Errno::EACCES));
        assert_eq!(may(other, Perm::empty()), Got::Ok, "F_OK");
    }

    #[test]
    fn statfs_tells_the_host_s_figures_in_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let d = door(dir.path(), Caching::Shared);
        let Got::Statfs(s) = ask(|r| d.statfs_as(ROOT, r)) else {
            panic!("not a statfs")
        };
        let host = rustix::fs::statvfs(dir.path()).unwrap();
        let host_bytes = host.f_blocks * host.f_frsize;
        assert_eq!(s.block, 4096);
        assert_eq!(s.blocks, host_bytes / 4096);
        assert!(s.available <= s.free && s.free <= s.blocks);
        assert_eq!(s.name_max, 255);
    }
}
