//! Directories and listings: the entries a request makes or removes in a
//! directory (MKDIR, MKNOD, SYMLINK, LINK, RMDIR, RENAME), READLINK, and
//! the listings (OPENDIR, READDIR, READDIRPLUS).

use super::*;

impl Door {
    /// MKNOD: a regular file (made as an exclusive create), a device, a FIFO
    /// or a socket; a directory or a symlink is EINVAL.
    pub(crate) fn mknod_as(
        &self,
        who: Who,
        parent: INodeNo,
        name: &[u8],
        (mode, rdev): (u32, u32),
        reply: impl EntryAnswer,
    ) {
        let caller = self.caller_of(who);
        let set = with_mode(mode);
        let dir = self.id(parent);
        let result = match kind_of_mode(mode) {
            Some(FileKind::Regular) => self
                .fs
                .create(&caller, dir, name, Create::Guarded(set))
                .map(|(a, _)| a),
            Some(FileKind::Directory) | Some(FileKind::Symlink) | None => Err(Error::Inval),
            Some(k) => {
                let dev = rdev as libc::dev_t;
                let numbers = (libc::major(dev), libc::minor(dev));
                self.fs
                    .make(&caller, dir, name, NewEntry::Node(k, numbers), &set)
                    .map(|(a, _)| a)
            }
        };
        self.entry(reply, result)
    }

    pub(crate) fn mkdir_as(
        &self,
        who: Who,
        parent: INodeNo,
        name: &[u8],
        mode: u32,
        reply: impl EntryAnswer,
    ) {
        let caller = self.caller_of(who);
        let result = self
            .fs
            .mkdir(&caller, self.id(parent), name, &with_mode(mode))
            .map(|(a, _)| a);
        self.entry(reply, result)
    }

    pub(crate) fn symlink_as(
        &self,
        who: Who,
        parent: INodeNo,
        name: &[u8],
        target: &[u8],
        reply: impl EntryAnswer,
    ) {
        let caller = self.caller_of(who);
        let result = self
            .fs
            .symlink(&caller, self.id(parent), name, target, &SetAttr::default())
            .map(|(a, _)| a);
        self.entry(reply, result)
    }

    pub(crate) fn link_as(
        &self,
        who: Who,
        ino: INodeNo,
        (parent, name): (INodeNo, &[u8]),
        reply: impl EntryAnswer,
    ) {
        let caller = self.caller_of(who);
        let result = self
            .fs
            .link(&caller, self.id(ino), self.id(parent), name)
            .map(|(a, _)| a);
        self.entry(reply, result)
    }

    pub(crate) fn rmdir_as(&self, who: Who, parent: INodeNo, name: &[u8], reply: impl EmptyAnswer) {
        done(
            reply,
            self.fs.rmdir(&self.caller_of(who), self.id(parent), name),
        )
    }

    /// RENAME; RENAME_NOREPLACE and RENAME_EXCHANGE are not offered: callers
    /// (mv -n, for one) fall back to a plain rename on EINVAL.
    pub(crate) fn rename_as(
        &self,
        who: Who,
        (parent, name): (INodeNo, &[u8]),
        (new_parent, new_name): (INodeNo, &[u8]),
        flags: RenameFlags,
        reply: impl EmptyAnswer,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let (from, to) = (self.id(parent), self.id(new_parent));
        let caller = self.caller_of(who);
        done(reply, self.fs.rename(&caller, from, name, to, new_name))
    }

    pub(crate) fn readlink_as(&self, who: Who, ino: INodeNo, reply: impl DataAnswer) {
        match self.fs.readlink(&self.caller_of(who), self.id(ino)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// OPENDIR: no handle of its own.
    pub(crate) fn opendir_as(&self, reply: impl OpenAnswer) {
        reply.opened_as(FileHandle(0), self.opendir_flags(), None)
    }

    /// How a directory is opened: where a listing changes only through this
    /// door, which tells the kernel when, the kernel keeps it across opens.
    fn opendir_flags(&self) -> FopenFlags {
        match self.caching {
            Caching::Exclusive => FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            Caching::Shared => FopenFlags::empty(),
        }
    }

    pub(crate) fn readdir_as(
        &self,
        who: Who,
        ino: INodeNo,
        offset: u64,
        mut reply: impl ListingAnswer,
    ) {
        // A 4 KiB reply holds about 100 entries of short names.
        let listed = self.list(who, ino, offset, 112, |attr, name, cookie| {
            let ino = self.inos.ino(attr.fileid);
            reply.add(ino, cookie, kind(attr.kind), name)
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    pub(crate) fn readdirplus_as(
        &self,
        who: Who,
        ino: INodeNo,
        offset: u64,
        mut reply: impl ListingPlusAnswer,
    ) {
        let ttl = self.caching.ttl();
        // An entry with attributes takes about 160 bytes of a 4 KiB reply.
        let listed = self.list(who, ino, offset, 26, |attr, name, cookie| {
            let fattr = self.inos.attr(attr);
            reply.add(cookie, name, &ttl, &fattr, Generation(attr.generation))
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// Entries after `offset`, each with its attributes, to `add` until it
    /// says the reply is full. `fit` is about how many entries a reply holds:
    /// every entry asked for costs the filesystem a stat, and those past a
    /// full reply are asked for again by the next call.
    fn list(
        &self,
        who: Who,
        ino: INodeNo,
        offset: u64,
        fit: usize,
        mut add: impl FnMut(&Attr, &[u8], u64) -> bool,
    ) -> layerfs_vfs::Result<()> {
        let caller = self.caller_of(who);
        let dir = self.id(ino);
        let mut cookie = offset;
        loop {
            let page = self.fs.readdir(&caller, dir, cookie, fit, true)?;
            for e in &page.entries {
                cookie = e.cookie;
                let attr = match e.attr {
                    Some(a) => a,
                    // The dots come without attributes from some listings;
                    // other entries without them vanished while listed.
                    None if e.cookie <= 2 => match self.fs.getattr(e.fileid) {
                        Ok(a) => a,
                        Err(_) => continue,
                    },
                    None => continue,
                };
                if add(&attr, &e.name, e.cookie) {
                    return Ok(());
                }
            }
            if page.eof || page.entries.is_empty() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::path::Path;

    use crate::types::FileType;

    use super::super::testing::{ask, ask_with_room, door, entry, me, Got, ROOT};
    use super::*;

    #[test]
    fn entries_made_in_a_directory_are_what_the_host_then_holds() {
        let dir = tempfile::tempdir().unwrap();
        let host = |name: &str| std::fs::symlink_metadata(dir.path().join(name)).unwrap();
        let d = door(dir.path(), Caching::Shared);
        let sub = entry(ask(|r| d.mkdir_as(me(), ROOT, b"sub", 0o40750, r)));
        assert_eq!((sub.kind, sub.perm), (FileType::Directory, 0o750));
        assert!(host("sub").is_dir());
        assert_eq!(host("sub").mode() & 0o7777, 0o750);

        let fifo = (libc::S_IFIFO | 0o600, 0);
        let pipe = entry(ask(|r| d.mknod_as(me(), sub.ino, b"pipe", fifo, r)));
        assert_eq!(pipe.kind, FileType::NamedPipe);
        assert!(host("sub/pipe").file_type().is_fifo());
        let file = (libc::S_IFREG | 0o640, 0);
        let f = entry(ask(|r| d.mknod_as(me(), ROOT, b"f", file, r)));
        assert_eq!((f.kind, f.perm, f.size), (FileType::RegularFile, 0o640, 0));
        let a_dir = (libc::S_IFDIR | 0o755, 0);
        let refused = ask(|r| d.mknod_as(me(), ROOT, b"d", a_dir, r));
        assert_eq!(
            refused,
            Got::Error(Errno::EINVAL),
            "a directory through MKNOD"
        );
        let taken = ask(|r| d.mkdir_as(me(), ROOT, b"f", 0o755, r));
        assert_eq!(taken, Got::Error(Errno::from_i32(libc::EEXIST)));

        let link = entry(ask(|r| d.symlink_as(me(), ROOT, b"l", b"sub/pipe", r)));
        assert_eq!(link.kind, FileType::Symlink);
        let target = ask(|r| d.readlink_as(me(), link.ino, r));
        assert_eq!(target, Got::Data(b"sub/pipe".to_vec()));
        assert_eq!(
            std::fs::read_link(dir.path().join("l")).unwrap(),
            Path::new("sub/pipe")
        );

        let again = entry(ask(|r| d.link_as(me(), f.ino, (ROOT, b"g"), r)));
        assert_eq!((again.ino, again.nlink), (f.ino, 2), "one file, two names");
        assert_eq!(host("g").ino(), host("f").ino());
    }

    #[test]
    fn a_rename_moves_the_name_and_one_with_flags_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("full")).unwrap();
        std::fs::write(dir.path().join("full/f"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        let d = door(dir.path(), Caching::Shared);
        let no_replace = RenameFlags::RENAME_NOREPLACE;
        let refused = ask(|r| d.rename_as(me(), (ROOT, b"full"), (ROOT, b"x"), no_replace, r));
        assert_eq!(refused, Got::Error(Errno::EINVAL));
        assert!(dir.path().join("full").exists(), "nothing moved");
        let flags = RenameFlags::empty();
        let moved = ask(|r| d.rename_as(me(), (ROOT, b"full"), (ROOT, b"moved"), flags, r));
        assert_eq!(moved, Got::Ok);
        assert!(dir.path().join("moved/f").exists() && !dir.path().join("full").exists());
        let missing = ask(|r| d.rename_as(me(), (ROOT, b"full"), (ROOT, b"y"), flags, r));
        assert_eq!(missing, Got::Error(Errno::from_i32(libc::ENOENT)));

        let not_empty = ask(|r| d.rmdir_as(me(), ROOT, b"moved", r));
        assert_eq!(not_empty, Got::Error(Errno::from_i32(libc::ENOTEMPTY)));
        assert_eq!(ask(|r| d.rmdir_as(me(), ROOT, b"empty", r)), Got::Ok);
        assert!(!dir.path().join("empty").exists());
    }

    #[test]
    fn a_listing_resumes_after_the_last_entry_a_full_reply_took() {
        let dir = tempfile::tempdir().unwrap();
        let names: BTreeSet<Vec<u8>> = (0..30).map(|i| format!("f{i}").into_bytes()).collect();
        for (i, name) in names.iter().enumerate() {
            let path = dir.path().join(std::str::from_utf8(name).unwrap());
            std::fs::write(path, vec![b'x'; i]).unwrap();
        }
        let d = door(dir.path(), Caching::Shared);
        // Replies of 7 entries, each listing resumed from the last cookie.
        let (mut seen, mut offset, mut replies) = (Vec::new(), 0, 0);
        loop {
            let Got::Listed(page) = ask_with_room(7, |r| d.readdir_as(me(), ROOT, offset, r))
            else {
                panic!("not a listing")
            };
            let Some(last) = page.last() else { break };
            assert!(page.len() <= 7);
            offset = last.1;
            replies += 1;
            seen.extend(page.into_iter().map(|(_, _, kind, name)| (name, kind)));
        }
        let files: BTreeSet<_> = seen
            .iter()
            .filter(|(name, _)| name != b"." && name != b"..")
            .map(|(name, kind)| {
                assert_eq!(*kind, FileType::RegularFile);
                name.clone()
            })
            .collect();
        assert_eq!(files, names, "every name once");
        assert_eq!(seen.len(), files.len() + 2, "no name twice, and the dots");
        assert!(replies >= 5, "{replies} replies of at most 7 entries");

        let Got::ListedPlus(plus) = ask(|r| d.readdirplus_as(me(), ROOT, 0, r)) else {
            panic!("not a listing with attributes")
        };
        for (_, name, attr) in plus.iter().filter(|(_, n, _)| n.starts_with(b"f")) {
            let path = dir.path().join(std::str::from_utf8(name).unwrap());
            assert_eq!(
                attr.size,
                std::fs::metadata(path).unwrap().len(),
                "{name:?}"
            );
        }
        assert_eq!(plus.len(), 32);
        let gone = ask(|r| d.readdir_as(me(), INodeNo(999_999), 0, r));
        assert!(matches!(gone, Got::Error(_)), "{gone:?}");
    }

    #[test]
    fn a_directory_listing_is_kept_across_opens_only_where_the_door_is_alone() {
        let dir = tempfile::tempdir().unwrap();
        let kept = FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE;
        assert_eq!(door(dir.path(), Caching::Exclusive).opendir_flags(), kept);
        assert_eq!(
            door(dir.path(), Caching::Shared).opendir_flags(),
            FopenFlags::empty()
        );
    }
}
