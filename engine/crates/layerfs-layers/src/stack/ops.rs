//! The [`Filesystem`] operations of [`StackFs`].

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use layerfs_vfs::access::{self, Caller, Perm};
use layerfs_vfs::hostdir::{
    self, check_name, check_setattr, creatable, exclusive_times, may_change_entries, may_rename,
    removable, sticky_allows,
};
use layerfs_vfs::XattrFlags;
use layerfs_vfs::{
    Allocate, Attr, Change, Create, DirPage, Error, FileId, FileKind, Filesystem, FsStat, Hints,
    Holder, HostFiles, KeptFile, NewEntry, ReadSource, RemovedFile, Result, SetAttr, Stability,
    Timestamp, READS_AT_HAND,
};
use rustix::fs::AtFlags;

use super::inodes::ROOT;
use super::merge::{Found, Layers, UPPER};
use super::quota::ENTRY_CHARGE;
use super::upper::links_left;
use super::whiteouts::{
    clear_markers, clear_whiteout, has_whiteout, is_hidden, mark_opaque, whiteout,
};
use super::StackFs;

/// A name clients may give a new entry: whiteout names would hide files.
fn new_name(name: &[u8]) -> Result<std::ffi::CString> {
    let cname = creatable(name)?;
    if is_hidden(name) {
        return Err(Error::Inval);
    }
    Ok(cname)
}

fn change(before: &Attr, after: Option<Attr>) -> Change {
    Change {
        before: Some(before.before_change()),
        after,
    }
}

impl StackFs {
    /// The entry just made as `name` in `dir`: directories' entries have
    /// changed, and the new one is found and remembered.
    fn made(&self, layers: &Layers, dir: FileId, name: &[u8], cname: &CStr) -> Result<Found> {
        self.tree.changed_entries();
        let f = layers
            .lookup(&self.tree.inodes, &self.tree.dir_parts(layers, dir)?, cname)?
            .ok_or(Error::Io)?;
        self.tree.remember(dir, name, f.attr.fileid);
        Ok(f)
    }

    fn dir_after(&self, layers: &Layers, dir: FileId) -> Option<Attr> {
        self.tree.found(layers, dir).ok().map(|f| f.attr)
    }

    /// An open file for `id`, and what clients see as its attributes, once
    /// `allowed` accepts those. With `write`, the file is brought into the
    /// upper first.
    fn open_file(
        &self,
        layers: &Layers,
        id: FileId,
        write: bool,
        allowed: impl Fn(&Attr) -> Result<()>,
    ) -> Result<(KeptFile, Attr)> {
        match self.open_host_file(layers, id, write, allowed)? {
            (file, Some(attr)) => Ok((file, attr)),
            (file, None) => {
                let host = file.attr(&layers.all[UPPER].host.stats)?;
                Ok((file, self.tree.shown(layers, UPPER, host)?))
            }
        }
    }

    /// [`open_file`](Self::open_file) for writing: the upper's file (a
    /// copy-up's), whose descriptor the change is made through.
    fn open_to_change(
        &self,
        layers: &Layers,
        id: FileId,
        allowed: impl Fn(&Attr) -> Result<()>,
    ) -> Result<(Arc<OwnedFd>, Attr)> {
        let (file, attr) = self.open_file(layers, id, true, allowed)?;
        Ok((upper_host(&file)?.clone(), attr))
    }

    /// [`open_file`](Self::open_file) for a caller that may not need the
    /// attributes: `None` for a copy made by this open, whose attributes the
    /// host is not asked for here (a door's open needs only the file).
    fn open_host_file(
        &self,
        layers: &Layers,
        id: FileId,
        write: bool,
        allowed: impl Fn(&Attr) -> Result<()>,
    ) -> Result<(KeptFile, Option<Attr>)> {
        if let Some((layer, fd)) = self.tree.caches.file(id, layers.generation) {
            if layer == UPPER || !write {
                let host = fd.attr(&layers.all[layer].host.stats)?;
                // No name leads to it any more (removed on the host behind
                // the workspace): it is looked for, and is most likely gone.
                if host.nlink > 0 {
                    let attr = self.tree.shown(layers, layer, host)?;
                    allowed(&attr)?;
                    return Ok((fd, Some(attr)));
                }
                self.tree.dropped_file(id);
            }
        }
        let mut f = match write {
            true => self.tree.found_to_write(layers, id)?,
            false => self.tree.found(layers, id)?,
        };
        match f.kind() {
            FileKind::Regular => {}
            FileKind::Directory => return Err(Error::IsDir),
            _ => return Err(Error::Inval),
        }
        allowed(&f.attr)?;
        if write && f.layer != UPPER {
            // The copy, open already.
            if let Some(fd) = self.changing(layers).copy_up_open(id)? {
                let fd = upper_file(fd);
                // The copy is known by the id and generation of the file it
                // copies (its identity, noted by the copy-up).
                let stamp = self.tree.caches.stamp(layers.generation);
                self.tree
                    .caches
                    .keep_file(id, stamp, UPPER, fd.clone(), f.attr.generation);
                return Ok((fd, None));
            }
            f = self.tree.found(layers, id)?;
        }
        // A lower file is only read: never open for writing, which would
        // also keep the host from running it (ETXTBSY).
        let fd = match f.layer {
            UPPER => upper_file(hostdir::open_file(f.parent.as_fd(), &f.name)?),
            _ => self.tree.open_lower(f.parent.as_fd(), &f.name)?,
        };
        let stamp = self.tree.caches.stamp(layers.generation);
        self.tree
            .caches
            .keep_file(id, stamp, f.layer, fd.clone(), f.attr.generation);
        Ok((fd, Some(f.attr)))
    }

    /// The change to the upper file `fd`, which clients saw as `before`:
    /// its attributes now, under the id and generation clients know it by.
    fn changed_upper_file(&self, layers: &Layers, fd: &OwnedFd, before: &Attr) -> Result<Change> {
        let after = layers.all[UPPER].host.stats.fd(fd.as_fd())?;
        let after = Attr {
            fileid: before.fileid,
            generation: before.generation,
            ..after
        };
        Ok(change(before, Some(after)))
    }

    fn readable(&self, layers: &Layers, caller: &Caller, id: FileId) -> Result<(KeptFile, Attr)> {
        // The owner may read its own file whatever the mode, as in LocalFs.
        self.open_file(layers, id, false, |attr| {
            if !access::owner_may(attr, caller, Perm::READ) {
                return Err(Error::Access);
            }
            Ok(())
        })
    }

    /// Directory `dir` and its entry `name`, which `caller` may remove or
    /// rename away.
    fn victim(
        &self,
        layers: &Layers,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
    ) -> Result<(Found, Found)> {
        let cname = removable(name)?;
        let d = self.tree.dir_for(layers, caller, dir, Perm::EXEC)?;
        let f = match is_hidden(name) {
            true => None,
            false => layers.lookup(&self.tree.inodes, &d.parts, &cname)?,
        }
        .ok_or(Error::NoEnt)?;
        may_change_entries(caller, &d.attr)?;
        sticky_allows(caller, &d.attr, &f.attr)?;
        Ok((d, f))
    }
}

impl Filesystem for StackFs {
    fn root(&self) -> FileId {
        ROOT
    }

    fn hints(&self) -> &dyn Hints {
        self
    }

    fn host_files(&self) -> Option<&dyn HostFiles> {
        Some(self)
    }

    /// The root is the workspace's for its life, and a kept directory or
    /// open file keeps its identity while it is kept: none asks the host.
    fn still_names(&self, id: FileId, generation: u64) -> Result<()> {
        if id == ROOT && generation == self.tree.inodes.workspace {
            return Ok(());
        }
        let stack_generation = self.tree.current().generation;
        let kept = |d: &Found| d.attr.generation == generation;
        if self.tree.caches.dir_holds(id, stack_generation, kept)
            || self.tree.caches.file_is(id, stack_generation, generation)
        {
            return Ok(());
        }
        self.check_generation(id, generation).map(drop)
    }

    fn getattr(&self, id: FileId) -> Result<Attr> {
        Ok(self.tree.found(&self.tree.current(), id)?.attr)
    }

    fn setattr(
        &self,
        caller: &Caller,
        id: FileId,
        set: &SetAttr,
        guard: Option<Timestamp>,
    ) -> Result<Change> {
        let layers = self.tree.read_layers();
        let c = self.changing(&layers);
        let before = self.tree.found(&layers, id)?;
        if guard.is_some_and(|ctime| ctime != before.attr.ctime) {
            return Err(Error::NotSync);
        }
        let set = &check_setattr(caller, &before.attr, set)?;
        if set.is_empty() {
            return Ok(change(&before.attr, Some(before.attr)));
        }
        let before_attr = before.attr;
        let f = match before.layer == UPPER {
            true => before,
            false => {
                c.copy_up(id)?;
                self.tree.found(&layers, id)?
            }
        };
        if let Some(size) = set.size {
            match size > f.host.size {
                true => self.upper.quota.reserve(&layers, size - f.host.size)?,
                false => self.upper.quota.freed(),
            }
        }
        let host = layers.all[UPPER]
            .host
            .change(f.parent.as_fd(), &f.name, &f.host, set)
            .inspect_err(|_| self.upper.quota.freed())?;
        Ok(change(&before_attr, Some(f.shown(host))))
    }

    fn lookup_in(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<(Result<Attr>, Attr)> {
        check_name(name)?;
        let layers = self.tree.current();
        let d = self.tree.dir_for(&layers, caller, dir, Perm::EXEC)?;
        let found = match name {
            b"." => Ok(d.attr),
            b".." if dir == ROOT => Ok(d.attr),
            b".." => self
                .tree
                .node(&layers, dir)
                .and_then(|node| self.tree.found(&layers, node.parent))
                .map(|parent| parent.attr),
            _ if is_hidden(name) => Err(Error::NoEnt),
            _ => self.tree.look_up(&layers, dir, &d, name).inspect(|attr| {
                self.tree.remember(dir, name, attr.fileid);
            }),
        };
        Ok((found, d.attr))
    }

    fn readlink(&self, _caller: &Caller, id: FileId) -> Result<Vec<u8>> {
        let f = self.tree.found(&self.tree.current(), id)?;
        if f.kind() != FileKind::Symlink {
            return Err(Error::Inval);
        }
        Ok(rustix::fs::readlinkat(&*f.parent, &f.name, Vec::new())?.into_bytes())
    }

    fn read(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        count: usize,
        dst: &mut Vec<u8>,
    ) -> Result<(bool, Attr)> {
        let (file, attr) = self.readable(&self.tree.current(), caller, id)?;
        file.read_shown(attr, offset, count, dst)
    }

    fn write(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        data: &[u8],
        stable: Stability,
    ) -> Result<(Change, Stability)> {
        let layers = self.tree.read_layers();
        let _changing = self.upper.lock_stripe(id);
        let (fd, before) = self.open_to_change(&layers, id, |attr| {
            if !access::owner_may(attr, caller, Perm::WRITE) {
                return Err(Error::Access);
            }
            Ok(())
        })?;
        let end = offset.saturating_add(data.len() as u64);
        self.upper
            .quota
            .reserve(&layers, end.saturating_sub(before.size))?;
        if let Some(mode) = hostdir::mode_after_write(caller, &before) {
            rustix::fs::fchmod(&*fd, hostdir::permissions(mode))?;
        }
        // A copy-up this write made is durable before the write is.
        if stable != Stability::Unstable {
            self.make_durable()
                .inspect_err(|_| self.upper.quota.freed())?;
        }
        if let Err(e) = hostdir::write_at(fd.as_fd(), offset, data, stable) {
            self.upper.quota.freed();
            return Err(e);
        }
        Ok((self.changed_upper_file(&layers, &fd, &before)?, stable))
    }

    fn allocate(&self, id: FileId, offset: u64, len: u64, how: Allocate) -> Result<Change> {
        let layers = self.tree.read_layers();
        let _changing = self.upper.lock_stripe(id);
        let (fd, before) = self.open_to_change(&layers, id, |_| Ok(()))?;
        if how == Allocate::Extend {
            let end = offset.saturating_add(len);
            self.upper
                .quota
                .reserve(&layers, end.saturating_sub(before.size))?;
        }
        hostdir::allocate(fd.as_fd(), offset, len, how)
            .inspect_err(|_| self.upper.quota.freed())?;
        self.changed_upper_file(&layers, &fd, &before)
    }

    fn commit(&self, id: FileId) -> Result<Change> {
        let layers = self.tree.current();
        let (fd, before) = match self.open_file(&layers, id, false, |_| Ok(())) {
            // A directory's entries: its upper part's, where it has one (the
            // layers' never change), and the copy-ups made so far.
            Err(Error::IsDir) => {
                let dir = self.tree.found(&layers, id)?;
                if dir.parts[0].layer == UPPER {
                    hostdir::sync_all(dir.parts[0].fd.as_fd())?;
                }
                self.make_durable()?;
                return Ok(change(&dir.attr, Some(dir.attr)));
            }
            other => other?,
        };
        fd.sync(false)?;
        self.make_durable()?;
        Ok(change(&before, Some(before)))
    }

    fn create(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        how: Create,
    ) -> Result<(Attr, Change)> {
        let cname = new_name(name)?;
        let layers = self.tree.read_layers();
        let c = self.changing(&layers);
        let d = self.tree.dir_for(&layers, caller, dir, Perm::EXEC)?;
        let (existing, whited_out) = self.tree.lookup_to_make(&layers, caller, &d, &cname)?;
        // Beside an entry of the upper, a whiteout is not looked for.
        let whited_out = whited_out || existing.is_some();
        if existing.is_none() || matches!(how, Create::Exclusive(_)) {
            may_change_entries(caller, &d.attr)?;
        }
        // A new entry takes room; one made again (truncated) may free some.
        match existing.is_none() {
            true => self.upper.quota.reserve(&layers, ENTRY_CHARGE)?,
            false => self.upper.quota.freed(),
        }
        if let Some(f) = existing {
            self.tree.remember(dir, name, f.attr.fileid);
            match how {
                Create::Guarded(_) => return Err(Error::Exist),
                Create::Exclusive(verf) if f.layer != UPPER => {
                    if f.kind() == FileKind::Regular
                        && exclusive_times(verf) == (f.host.atime, f.host.mtime)
                    {
                        return Ok((f.attr, change(&d.attr, Some(d.attr))));
                    }
                    return Err(Error::Exist);
                }
                Create::Unchecked(_) if f.kind() == FileKind::Directory => {
                    return Err(Error::IsDir);
                }
                Create::Unchecked(set) if f.layer != UPPER && set.size.is_some() => {
                    if !access::owner_may(&f.attr, caller, Perm::WRITE) {
                        return Err(Error::Access);
                    }
                    c.copy_up(f.attr.fileid)?;
                }
                Create::Unchecked(_) if f.layer != UPPER => {
                    return Ok((f.attr, change(&d.attr, Some(d.attr))));
                }
                _ => {}
            }
        }
        let up = c.upper_dir_of(dir, &d)?;
        let (host, made) =
            layers.all[UPPER]
                .host
                .create(caller, up.as_fd(), &d.attr, &cname, how)?;
        if whited_out {
            clear_whiteout(up.as_fd(), name)?;
        }
        self.tree.changed_entries();
        let attr = self.tree.shown(&layers, UPPER, host)?;
        self.tree.remember(dir, name, attr.fileid);
        match made {
            Some(file) => {
                let stamp = self.tree.caches.stamp(layers.generation);
                let file = upper_file(file);
                self.tree
                    .caches
                    .keep_file(attr.fileid, stamp, UPPER, file, attr.generation);
            }
            None => self.tree.dropped_file(attr.fileid),
        }
        Ok((attr, change(&d.attr, self.dir_after(&layers, dir))))
    }

    fn make(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        what: NewEntry<'_>,
        set: &SetAttr,
    ) -> Result<(Attr, Change)> {
        let cname = new_name(name)?;
        let layers = self.tree.read_layers();
        let c = self.changing(&layers);
        let d = self.tree.dir_for(&layers, caller, dir, Perm::EXEC)?;
        let (existing, hidden_below) = self.tree.lookup_to_make(&layers, caller, &d, &cname)?;
        if existing.is_some() {
            return Err(Error::Exist);
        }
        may_change_entries(caller, &d.attr)?;
        let up = c.upper_dir_of(dir, &d)?;
        self.upper.quota.reserve(&layers, ENTRY_CHARGE)?;
        let host = &layers.all[UPPER].host;
        if hidden_below && matches!(what, NewEntry::Dir) {
            // Made whole elsewhere, so the directories of this name below
            // never show through it, not even for a moment.
            let staged = self.upper.stage(true);
            let tmp = &staged.name;
            host.make(caller, self.upper.work.as_fd(), &d.attr, tmp, what, set)?;
            let made = hostdir::open_dir(self.upper.work.as_fd(), tmp)?;
            mark_opaque(made.as_fd())?;
            // A read-only directory moves only with its owner's write
            // permission, lent for it.
            hostdir::lending_write(&[made.as_fd()], || {
                Ok(rustix::fs::renameat(&self.upper.work, tmp, &*up, &cname)?)
            })?;
        } else {
            host.make(caller, up.as_fd(), &d.attr, &cname, what, set)?;
        }
        if hidden_below {
            clear_whiteout(up.as_fd(), name)?;
        }
        let f = self.made(&layers, dir, name, &cname)?;
        Ok((f.attr, change(&d.attr, self.dir_after(&layers, dir))))
    }

    fn remove(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Change> {
        let layers = self.tree.read_layers();
        let c = self.changing(&layers);
        let (d, f) = self.victim(&layers, caller, dir, name)?;
        if f.kind() == FileKind::Directory {
            return Err(Error::IsDir);
        }
        self.removed.before_removal(&f.attr);
        c.unlink_entry(dir, &d, &f, name)?;
        self.upper.quota.freed();
        Ok(change(&d.attr, self.dir_after(&layers, dir)))
    }

    fn rmdir(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Change> {
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        let layers = self.tree.read_layers();
        let c = self.changing(&layers);
        let (d, f) = self.victim(&layers, caller, dir, name)?;
        if f.kind() != FileKind::Directory {
            return Err(Error::NotDir);
        }
        if !layers.list(&self.tree.inodes, &f.parts)?.is_empty() {
            return Err(Error::NotEmpty);
        }
        c.unlink_entry(dir, &d, &f, name)?;
        self.upper.quota.freed();
        Ok(change(&d.attr, self.dir_after(&layers, dir)))
    }

    fn rename(
        &self,
        caller: &Caller,
        from: FileId,
        from_name: &[u8],
        to: FileId,
        to_name: &[u8],
    ) -> Result<(Change, Change)> {
        let from_c = removable(from_name)?;
        let to_c = new_name(to_name).map_err(|e| match e {
            Error::Exist => Error::Inval,
            e => e,
        })?;
        let layers = self.tree.read_layers();
        let c = self.changing(&layers);
        let (fd_, src) = self.victim(&layers, caller, from, from_name)?;
        let td = match to == from {
            true => fd_.clone(),
            false => self.tree.dir_for(&layers, caller, to, Perm::EXEC)?,
        };
        let (dst, hidden_at_dst) = layers.lookup_for_new(&self.tree.inodes, &td.parts, &to_c)?;
        let replaced = dst.as_ref().map(|d| &d.attr);
        may_rename(caller, (&fd_.attr, &src.attr), (&td.attr, replaced))?;
        let unchanged = || {
            Ok((
                change(&fd_.attr, Some(fd_.attr)),
                change(&td.attr, Some(td.attr)),
            ))
        };
        if let Some(dst) = &dst {
            sticky_allows(caller, &td.attr, &dst.attr)?;
            if dst.attr.fileid == src.attr.fileid {
                return unchanged();
            }
            let src_dir = src.kind() == FileKind::Directory;
            match (src_dir, dst.kind() == FileKind::Directory) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if !layers.list(&self.tree.inodes, &dst.parts)?.is_empty() => {
                    return Err(Error::NotEmpty)
                }
                _ => {}
            }
        }
        let moving_dir = src.kind() == FileKind::Directory;
        if moving_dir {
            // Not into itself or below itself.
            let mut at = to;
            while at != ROOT {
                if at == src.attr.fileid {
                    return Err(Error::Inval);
                }
                at = self.tree.node(&layers, at)?.parent;
            }
        }
        // A lower file with other names loses this one: they become one
        // upper file first, as for an unlink, so they count a link less.
        let dst = match dst {
            Some(d) if d.layer != UPPER && d.kind() == FileKind::Regular && d.host.nlink > 1 => {
                self.tree.remember(to, to_name, d.attr.fileid);
                c.copy_up(d.attr.fileid)?;
                let to_now = self.tree.found(&layers, to)?;
                layers.lookup(&self.tree.inodes, &to_now.parts, &to_c)?
            }
            other => other,
        };
        let id = src.attr.fileid;
        self.tree.remember(from, from_name, id);
        // The source, whole in the upper: a lower directory cannot move.
        if moving_dir && (src.layer != UPPER || src.parts.len() > 1) {
            c.copy_up_tree(id)?;
        } else if src.layer != UPPER {
            c.copy_up(id)?;
        }
        let up_from = c.upper_dir_of(from, &fd_)?;
        let up_to = c.upper_dir_of(to, &td)?;
        let from_parts = self.tree.dir_parts(&layers, from)?;
        let src_below = layers.shows_below(&from_parts, UPPER, &from_c)?;
        let to_parts = self.tree.dir_parts(&layers, to)?;
        let whiteout_at_dst = match &dst {
            None => hidden_at_dst,
            Some(_) => has_whiteout(up_to.as_fd(), to_name)?,
        };
        let dst_below = whiteout_at_dst || layers.shows_below(&to_parts, UPPER, &to_c)?;
        // The source is in the upper now; a file it replaces moves.
        let _moving = dst.as_ref().map(|d| self.tree.moving(d.attr.fileid));
        if moving_dir && dst_below {
            let moved = hostdir::open_dir(up_from.as_fd(), &from_c)?;
            mark_opaque(moved.as_fd())?;
        }
        if let Some(dst) = &dst {
            if dst.layer == UPPER && dst.kind() == FileKind::Directory {
                clear_markers(dst.parts[0].fd.as_fd())?;
            }
        }
        if src_below {
            whiteout(up_from.as_fd(), from_name)?;
        }
        if let Some(dst) = &dst {
            self.removed.before_removal(&dst.attr);
        }
        rustix::fs::renameat(&*up_from, &from_c, &*up_to, &to_c)?;
        // A file it replaced frees its room.
        self.upper.quota.freed();
        if whiteout_at_dst {
            clear_whiteout(up_to.as_fd(), to_name)?;
        }
        if let Some(dst) = dst {
            if dst.layer == UPPER && (dst.host.nlink <= 1 || dst.kind() == FileKind::Directory) {
                self.tree.inodes.forget(layers.tag(UPPER), dst.host.fileid);
            }
            if dst.attr.fileid != id {
                self.tree
                    .unlinked(to, to_name, dst.attr.fileid, links_left(&dst));
            }
        }
        self.tree.remember(to, to_name, id);
        if moving_dir {
            self.tree.changed_dirs();
        }
        self.tree.changed_entries();
        let from_after = self.dir_after(&layers, from);
        let to_after = match to == from {
            true => from_after,
            false => self.dir_after(&layers, to),
        };
        Ok((change(&fd_.attr, from_after), change(&td.attr, to_after)))
    }

    fn link(
        &self,
        caller: &Caller,
        id: FileId,
        dir: FileId,
        name: &[u8],
    ) -> Result<(Attr, Change)> {
        let cname = new_name(name)?;
        let layers = self.tree.read_layers();
        let c = self.changing(&layers);
        let src = self.tree.found(&layers, id)?;
        if src.kind() == FileKind::Directory {
            return Err(Error::IsDir);
        }
        let d = self.tree.dir_for(&layers, caller, dir, Perm::EXEC)?;
        let (existing, whited_out) = layers.lookup_for_new(&self.tree.inodes, &d.parts, &cname)?;
        if existing.is_some() {
            return Err(Error::Exist);
        }
        may_change_entries(caller, &d.attr)?;
        c.copy_up(id)?;
        let src = self.tree.found(&layers, id)?;
        let up = c.upper_dir_of(dir, &d)?;
        link_at(src.parent.as_fd(), &src.name, up.as_fd(), &cname)?;
        if whited_out {
            clear_whiteout(up.as_fd(), name)?;
        }
        self.tree.changed_entries();
        self.tree.remember(dir, name, id);
        let attr = self.tree.found(&layers, id)?.attr;
        Ok((attr, change(&d.attr, self.dir_after(&layers, dir))))
    }

    fn readdir(
        &self,
        caller: &Caller,
        dir: FileId,
        cookie: u64,
        max: usize,
        with_attrs: bool,
    ) -> Result<DirPage> {
        let layers = self.tree.current();
        let d = self.tree.dir_for(&layers, caller, dir, Perm::READ)?;
        let parent = if dir == ROOT {
            dir
        } else {
            self.tree.node(&layers, dir)?.parent
        };
        // Taken before anything is read, as every kept answer's stamp is.
        let stamp = self.tree.caches.stamp(layers.generation);
        let listing = self.tree.listing(&layers, dir, &d)?;
        let first = listing.partition_point(|e| e.0 <= cookie);
        let named = listing[first..]
            .iter()
            .map(|(cookie, e)| (e.id, &e.name[..], *cookie));
        let mut page = DirPage::after(dir, d.attr, parent, cookie, max, named);
        if with_attrs {
            let dots = page.entries.iter().take_while(|e| e.cookie <= 2).count();
            let (dots, named) = page.entries.split_at_mut(dots);
            for e in dots {
                e.attr = match e.cookie {
                    1 => Some(d.attr),
                    _ => self.tree.found(&layers, parent).ok().map(|f| f.attr),
                };
            }
            // The page's named entries are the listing's from `first` on, in
            // order. Lower files' kept attributes come under one lock; the
            // rest are read one by one.
            let listed = &listing[first..first + named.len()];
            let lower: Vec<usize> = (0..listed.len())
                .filter(|&i| {
                    listed[i]
                        .1
                        .alone_in
                        .as_ref()
                        .is_some_and(|p| p.layer != UPPER)
                })
                .collect();
            let ids = lower.iter().map(|&i| listed[i].1.id);
            self.tree
                .caches
                .lower_attrs(ids, layers.generation, |at, attr| {
                    named[lower[at]].attr = Some(attr);
                });
            let mut reads = 0;
            for (e, (_, l)) in named.iter_mut().zip(listed) {
                if e.attr.is_none() {
                    e.attr = self.tree.listed_attr(&layers, &d, l);
                    reads += 1;
                }
            }
            self.tree.caches.keep_listed_reads(dir, stamp, reads);
        }
        Ok(page)
    }

    fn fsstat(&self, _id: FileId) -> Result<FsStat> {
        hostdir::fsstat(self.tree.current().all[UPPER].root.as_fd())
    }

    fn getxattr(&self, id: FileId, name: &[u8]) -> Result<Vec<u8>> {
        self.get_xattr(id, name)
    }

    fn listxattr(&self, id: FileId) -> Result<Vec<u8>> {
        self.list_xattrs(id)
    }

    fn setxattr(&self, id: FileId, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        self.change_xattr(id, name, Some((value, flags)))
    }

    fn removexattr(&self, id: FileId, name: &[u8]) -> Result<()> {
        self.change_xattr(id, name, None)
    }
}

impl Hints for StackFs {
    fn knows(&self, id: FileId) -> bool {
        self.tree.ids.knows(id)
    }

    /// Not for a file found or opened in the upper, nor a directory kept
    /// with no lower part: in this generation neither is found in a lower
    /// layer again. Not for an entry that no lower part of its directory
    /// holds, as their indexes already read tell: it is the upper's, or
    /// none (a directory's lower parts never gain a name). While a commit
    /// changes the stack, anything may.
    fn may_copy_up(&self, id: FileId, entry: Option<&[u8]>) -> bool {
        let Some(layers) = self.tree.try_read_layers() else {
            return true;
        };
        match entry {
            None => !self.tree.caches.wholly_upper(id, layers.generation),
            Some(name) if id == ROOT => layers.below_may_hold(&layers.root_parts, name),
            Some(name) => !self.tree.caches.dir_holds(id, layers.generation, |d| {
                !layers.below_may_hold(&d.parts, name)
            }),
        }
    }

    /// A merged listing kept, still current; with attributes, when the
    /// last listing with them read at most [`READS_AT_HAND`] entries'
    /// attributes from the host (upper files and merged directories have
    /// none kept; lower files have theirs once listed).
    fn lists_at_hand(&self, dir: FileId, with_attrs: bool) -> bool {
        let Some(layers) = self.tree.try_read_layers() else {
            return false;
        };
        self.tree.caches.listing(dir, layers.generation).is_some()
            && (!with_attrs
                || self
                    .tree
                    .caches
                    .listed_reads(dir, layers.generation)
                    .is_some_and(|reads| reads <= READS_AT_HAND))
    }
}

impl HostFiles for StackFs {
    /// A file of the upper, after a copy-up for `write`. A file still in a
    /// lower layer is not handed out for reading: a write elsewhere would
    /// copy it up, and whoever read the lower file directly would not see
    /// the change, where reads through the stack do.
    fn host_file(&self, caller: &Caller, id: FileId, write: bool) -> Result<Option<Arc<OwnedFd>>> {
        // Under a size limit every write is counted here.
        if write && self.upper.quota.counts_writes() {
            return Ok(None);
        }
        let layers = self.tree.read_layers();
        if !write && self.tree.found(&layers, id)?.layer != UPPER {
            return Ok(None);
        }
        let want = if write {
            Perm::READ | Perm::WRITE
        } else {
            Perm::READ
        };
        let (file, _) = self.open_host_file(&layers, id, write, |attr| {
            if !access::permits(attr, caller, want) {
                return Err(Error::Access);
            }
            Ok(())
        })?;
        Ok(Some(upper_host(&file)?.clone()))
    }

    /// While `kept` is still the file's descriptor kept here, in the upper,
    /// and writes are not counted: a copy-up or removal since
    /// [`file_to_keep`](HostFiles::file_to_keep) dropped it.
    fn kept_is_host_file(&self, id: FileId, kept: &KeptFile, write: bool) -> bool {
        if write && self.upper.quota.counts_writes() {
            return false;
        }
        let generation = self.tree.current().generation;
        matches!(self.tree.caches.file(id, generation), Some((UPPER, file)) if file.is(kept))
    }

    /// A lower file is read through the fill of the store's lazy layers.
    fn file_to_keep(&self, id: FileId, write: bool) -> Result<Option<KeptFile>> {
        let layers = self.tree.current();
        // The door's open has just found the file: a descriptor kept for it
        // is taken without asking the host again (one stat per open less).
        if let Some((layer, file)) = self.tree.caches.file(id, layers.generation) {
            if layer == UPPER || !write {
                return Ok(Some(file));
            }
        }
        // For writing, the upper's (a copy-up's); for reading, either.
        let (file, _) = self.open_host_file(&layers, id, write, |_| Ok(()))?;
        Ok(Some(file))
    }

    /// Linked under the state directory, in `removed/`.
    fn hold_removed_for(&self, holder: Arc<dyn Holder>) {
        self.removed.hold_for(holder);
    }

    fn kept_removed(&self) -> Result<Vec<RemovedFile>> {
        Ok(self.removed.kept(|fd, write| self.tree.kept(fd, write))?)
    }

    fn forget_removed(&self, id: FileId) -> Result<()> {
        Ok(self.removed.forget(id)?)
    }

    fn read_source(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        count: usize,
    ) -> Result<Option<ReadSource>> {
        let (file, attr) = self.readable(&self.tree.current(), caller, id)?;
        Ok(Some(file.read_source(attr, offset, count)?))
    }
}

fn link_at(src_dir: BorrowedFd<'_>, src: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    Ok(rustix::fs::linkat(
        src_dir,
        src,
        dir,
        name,
        AtFlags::empty(),
    )?)
}

/// File `fd` of the upper, which holds all its data (a copy-up brings
/// every byte in first).
fn upper_file(fd: OwnedFd) -> KeptFile {
    KeptFile::whole(Arc::new(fd))
}

/// The descriptor of `file`, open in the upper: what a change is made
/// through. A lower file (read through a fill, never changed) has none.
fn upper_host(file: &KeptFile) -> Result<&Arc<OwnedFd>> {
    file.whole_host().ok_or(Error::RoFs)
}
