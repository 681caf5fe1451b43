//! Entries and attributes: LOOKUP, GETATTR, SETATTR and UNLINK as the
//! rings answer them themselves, and fuser's session through the same code.

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
        match self.or_held(id, false, self.fs.getattr(id), |file| held_attr(id, file)) {
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
        let result = self.or_held(id, true, result, |file| {
            let set = hostdir::check_setattr(&caller, &held_attr(id, file)?, &set)?;
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
            held_attr(id, file)
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
}
