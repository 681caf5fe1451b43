//! Copy-up: bringing a lower file or directory into the upper before its
//! first change, keeping its identity.
//!
//! A copy is made in the work directory (on the upper's filesystem), given
//! the original's mode, owner (where the server may), times and data, its
//! data made durable, its identity noted in the inode map's log, and only
//! then renamed into place: a crash leaves either the lower file showing or
//! the whole copy, never a part of one.
//!
//! That is overlayfs' durability: one `fsync`, of the copy. The new entry in
//! the upper directory and the identity's record are made durable together,
//! for every copy-up since the last time, at the next point that promises
//! durability ([`StackFs::make_durable`]: an fsync or COMMIT of any file, a
//! FILE_SYNC write, a commit or reset), not by each copy-up. A crash of the
//! process loses neither (the host keeps both); a crash of the host before
//! that point may take a copy-up back, as it may any change not yet synced.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
#[cfg(target_os = "linux")]
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use layerfs_vfs::hostdir::{self, Host};
use layerfs_vfs::{Attr, Error, FileId, FileKind, KeptFile, Result, SetAttr, SetTime};
use rustix::fs::{AtFlags, Mode, OFlags};

use super::inodes::Origin;
use super::merge::{Found, UPPER};
use super::quota::ENTRY_CHARGE;
use super::upper::Changing;
use super::whiteouts::mark_opaque;
use super::xattrs;

/// Directories of the upper given new entries by copy-ups since they were
/// last synced; past this many they are synced at once.
const UNSYNCED_DIRS: usize = 64;

impl Changing<'_> {
    /// Notes that a copy was renamed into the upper directory `dir`.
    fn placed_in(&self, dir: &Arc<OwnedFd>) -> Result<()> {
        let mut dirs = self.upper.unsynced.dirs.lock();
        if dirs.iter().any(|d| Arc::ptr_eq(d, dir)) {
            return Ok(());
        }
        dirs.push(dir.clone());
        if dirs.len() < UNSYNCED_DIRS {
            return Ok(());
        }
        drop(dirs);
        self.upper.make_durable(&self.tree.inodes)
    }

    /// [`StackFs::upper_dir`] of directory `dir`, found as `d` under the
    /// same lock: no host call when `d` has its upper part already (a part
    /// it lacks may have been made since, so that case looks again).
    pub(super) fn upper_dir_of(&self, dir: FileId, d: &Found) -> Result<Arc<OwnedFd>> {
        match d.parts.first() {
            Some(top) if top.layer == UPPER => Ok(top.fd.clone()),
            _ => self.upper_dir(dir),
        }
    }

    /// The upper's part of directory `dir`, made (with the lower one's mode,
    /// owner and times) if it has none yet.
    pub(super) fn upper_dir(&self, dir: FileId) -> Result<Arc<OwnedFd>> {
        // Kept with its upper part: no host call.
        if let Some(top) = self.tree.kept_dir_part(self.layers, dir) {
            if top.layer == UPPER {
                return Ok(top.fd);
            }
        }
        let found = self.tree.found(self.layers, dir)?;
        if found.kind() != FileKind::Directory {
            return Err(Error::NotDir);
        }
        if found.parts[0].layer == UPPER {
            return Ok(found.parts[0].fd.clone());
        }
        let node = self.tree.node(self.layers, dir)?;
        let parent = self.upper_dir(node.parent)?;
        self.upper.quota.reserve(self.layers, ENTRY_CHARGE)?;
        let mut staged = self.upper.stage(true);
        let tmp = &staged.name.clone();
        let work = self.upper.work.as_fd();
        rustix::fs::mkdirat(work, tmp, Mode::from_raw_mode(0o700))?;
        xattrs::copy(
            found.parent.as_fd(),
            found.name.as_bytes(),
            work,
            tmp.to_bytes(),
        )?;
        let host = &self.layers.all[UPPER].host;
        copy_owner_mode_times(host, work, tmp, &found.host)?;
        let name = hostdir::cstr(&node.name)?;
        // Open before the move, which rewrites its `..`: a read-only copy
        // is lent its owner's write permission for that.
        let up = hostdir::open_dir(work, tmp)?;
        keeping_times(host, parent.as_fd(), || {
            hostdir::lending_write(&[up.as_fd()], || {
                Ok(rustix::fs::renameat(work, tmp, &*parent, &name)?)
            })
        })?;
        staged.placed = true;
        self.placed_in(&parent)?;
        self.tree.changed_dirs();
        Ok(Arc::new(up))
    }

    /// Brings the non-directory `id` into the upper. A regular file with
    /// other names in its lower layer brings them all, so they stay one file.
    pub(super) fn copy_up(&self, id: FileId) -> Result<()> {
        self.copy_up_open(id).map(drop)
    }

    /// [`copy_up`](Self::copy_up), and the copy of a regular file open for
    /// reading and writing: what the open for writing that caused the
    /// copy-up holds, with no second walk to it. `None` when there was
    /// nothing to copy (in the upper already) or no regular file.
    pub(super) fn copy_up_open(&self, id: FileId) -> Result<Option<OwnedFd>> {
        let found = self.tree.found(self.layers, id)?;
        if found.layer == UPPER {
            return Ok(None);
        }
        if found.kind() == FileKind::Directory {
            self.upper_dir(id)?;
            return Ok(None);
        }
        // From here, made or failed half way, it has moved.
        let _moving = self.tree.moving(id);
        let node = self.tree.node(self.layers, id)?;
        let parent = self.upper_dir(node.parent)?;
        let name = hostdir::cstr(&node.name)?;
        // The whole copy's room first: a copy-up never half happens.
        let bytes = match found.kind() {
            FileKind::Regular | FileKind::Symlink => found.host.size,
            _ => 0,
        };
        self.upper
            .quota
            .reserve(self.layers, ENTRY_CHARGE + bytes)?;
        let open = self
            .place_copy(&found, &parent, &name)
            .inspect_err(|_| self.upper.quota.freed())?;
        self.tree.caches.copied_up(id);
        if found.kind() == FileKind::Regular && found.host.nlink > 1 {
            self.copy_up_links(&found, parent.as_fd(), &name)?;
        }
        Ok(open)
    }

    /// Copies `found` into the work directory and renames the copy to `name`
    /// in the upper directory `parent`; a regular file's copy stays open.
    fn place_copy(
        &self,
        found: &Found,
        parent: &Arc<OwnedFd>,
        name: &CStr,
    ) -> Result<Option<OwnedFd>> {
        let host = &self.layers.all[UPPER].host;
        let work = self.upper.work.as_fd();
        let mut staged = self.upper.stage(false);
        let tmp = &staged.name.clone();
        let src_name = &found.name;
        let (copy, open) = match found.kind() {
            // Through descriptors: no path walked after the two opens.
            FileKind::Regular => {
                let src = self.tree.open_lower(found.parent.as_fd(), src_name)?;
                let dst = rustix::fs::openat(
                    work,
                    tmp,
                    OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                let copy = host.stats.fd(dst.as_fd())?;
                // Read before the data's copy takes `src`; set after it and
                // the owner, either of which would drop a file capability,
                // and before the mode, which may take away the write
                // permission a server that is not root sets them with.
                let kept = xattrs::served(found.parent.as_fd(), src_name.as_bytes())?;
                self.copy_data(&src, &dst, found.host.size)?;
                give_owner(host, dst.as_fd(), &copy, &found.host)?;
                xattrs::set_on(dst.as_fd(), kept)?;
                give_mode_times(dst.as_fd(), &found.host)?;
                hostdir::sync_all(dst.as_fd())?;
                (copy, Some(dst))
            }
            FileKind::Symlink => {
                let target = rustix::fs::readlinkat(&*found.parent, src_name, Vec::new())?;
                rustix::fs::symlinkat(&target, work, tmp)?;
                (self.finish_node(found, work, tmp)?, None)
            }
            FileKind::Directory => return Err(Error::IsDir),
            kind => {
                let caller = layerfs_vfs::Caller::root();
                let set = SetAttr {
                    mode: Some(found.host.mode),
                    ..SetAttr::default()
                };
                let new = layerfs_vfs::NewEntry::Node(kind, found.host.rdev);
                host.make(&caller, work, &found.host, tmp, new, &set)?;
                (self.finish_node(found, work, tmp)?, None)
            }
        };
        self.keep_identity(&copy, found)?;
        keeping_times(host, parent.as_fd(), || {
            Ok(rustix::fs::renameat(work, tmp, &**parent, name)?)
        })?;
        staged.placed = true;
        self.placed_in(parent)?;
        self.tree.changed_entries();
        Ok(open)
    }

    /// Gives the copy `tmp` of the symlink or special file `found` its
    /// owner, mode, times and extended attributes (by path: neither can be
    /// opened), and says what it is now.
    fn finish_node(&self, found: &Found, work: BorrowedFd<'_>, tmp: &CStr) -> Result<Attr> {
        let host = &self.layers.all[UPPER].host;
        copy_owner_mode_times(host, work, tmp, &found.host)?;
        xattrs::copy(
            found.parent.as_fd(),
            found.name.as_bytes(),
            work,
            tmp.to_bytes(),
        )?;
        host.stats.at(work, tmp)
    }

    /// Links the other lower names of `found`'s file to its upper copy.
    fn copy_up_links(&self, found: &Found, parent: BorrowedFd<'_>, name: &CStr) -> Result<()> {
        for path in self
            .tree
            .links_of(self.layers, found.layer, found.host.fileid)?
        {
            let Ok((dir, other)) = self.tree.resolve_path(self.layers, &path) else {
                continue;
            };
            // Only names that still show this very lower file.
            if other.layer != found.layer || other.host.fileid != found.host.fileid {
                continue;
            }
            let up = self.upper_dir(dir)?;
            let last = hostdir::cstr(path.last().expect("a path has a name"))?;
            keeping_times(&self.layers.all[UPPER].host, up.as_fd(), || {
                Ok(rustix::fs::linkat(
                    parent,
                    name,
                    &*up,
                    &last,
                    AtFlags::empty(),
                )?)
            })?;
        }
        self.tree.changed_entries();
        Ok(())
    }

    /// Makes the whole merged tree under directory `id` part of the upper,
    /// opaque, keeping every identity: what a rename of a directory with
    /// lower parts needs, since a lower directory cannot move.
    pub(super) fn copy_up_tree(&self, id: FileId) -> Result<()> {
        let up = self.upper_dir(id)?;
        let found = self.tree.found(self.layers, id)?;
        for e in self.layers.list(&self.tree.inodes, &found.parts)? {
            let child = e.id;
            self.tree.remember(id, &e.name, child);
            let f = self.tree.found(self.layers, child)?;
            if f.kind() == FileKind::Directory {
                self.copy_up_tree(child)?;
            } else {
                self.copy_up(child)?;
            }
        }
        self.keep_identity(&self.layers.all[UPPER].host.stats.fd(up.as_fd())?, &found)?;
        mark_opaque(up.as_fd())?;
        self.tree.changed_dirs();
        Ok(())
    }
}

impl Changing<'_> {
    /// Notes that the upper file `copy` is `original` (durable with the
    /// copy-up, at [`StackFs::make_durable`]).
    fn keep_identity(&self, copy: &Attr, original: &Found) -> Result<()> {
        let origin = Origin {
            id: original.attr.fileid,
            generation: original.attr.generation,
        };
        self.tree
            .inodes
            .note(&[(self.layers.tag(UPPER), copy.fileid, copy.generation, origin)])
    }

    /// [`copy_data`] of a lower file of `size` bytes, with no clone tried
    /// once the upper's filesystem has refused one.
    fn copy_data(&self, src: &KeptFile, dst: &OwnedFd, size: u64) -> Result<()> {
        let src = src.all_in(size)?;
        #[cfg(target_os = "linux")]
        if !self.upper.unsynced.no_clone.load(Relaxed) {
            match rustix::fs::ioctl_ficlone(dst, src) {
                Ok(()) => return Ok(()),
                // Another layer's file (XDEV) may clone where this one did not.
                Err(rustix::io::Errno::OPNOTSUPP) => {
                    self.upper.unsynced.no_clone.store(true, Relaxed)
                }
                Err(_) => {}
            }
        }
        copy_sized(src, dst, size)
    }
}

/// Copies a file's data: a clone where the filesystem shares blocks
/// (reflink), else a copy the kernel makes (`copy_file_range`), else one
/// buffer at a time: never the whole file in memory.
///
/// A signal caught by a handler installed without `SA_RESTART` (libFuzzer's
/// timer, for one) fails the kernel's copy with EINTR when it arrives before
/// a byte moved: both files' offsets say how far the copy got, so it goes on
/// from there.
pub(super) fn copy_data(src: OwnedFd, dst: &OwnedFd) -> Result<()> {
    #[cfg(target_os = "linux")]
    if rustix::fs::ioctl_ficlone(dst, &src).is_ok() {
        return Ok(());
    }
    copy_bytes(src, dst)
}

/// Copies the `size` bytes of a lower file (which never changes) by the
/// kernel's copy, one `copy_file_range` per GiB and no call to learn the
/// length; where the kernel refuses, [`copy_bytes`] goes on from where the
/// offsets are.
fn copy_sized(src: BorrowedFd<'_>, dst: &OwnedFd, size: u64) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        let mut left = size;
        while left > 0 {
            let chunk = usize::try_from(left.min(1 << 30)).unwrap_or(1 << 30);
            match rustix::fs::copy_file_range(src, None, dst, None, chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => left -= n as u64,
            }
        }
        if left == 0 {
            return Ok(());
        }
    }
    // Elsewhere std finds the length itself.
    #[cfg(not(target_os = "linux"))]
    let _ = size;
    // A second descriptor of the same open file: the copy goes on from
    // its offset.
    copy_bytes(src.try_clone_to_owned()?, dst)
}

/// Copies a file's data by the kernel's copy or one buffer at a time.
fn copy_bytes(src: OwnedFd, dst: &OwnedFd) -> Result<()> {
    let mut src = File::from(src);
    let mut dst = File::from(dst.try_clone()?);
    loop {
        match std::io::copy(&mut src, &mut dst) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs `change`, which adds a name to the upper directory `dir`, then gives
/// `dir` back its access and modification times: a copy-up is no change a
/// client made to the directory (overlayfs keeps them too). A read-only
/// `dir` is lent its owner's write permission ([`hostdir::lending_write`]).
fn keeping_times<T>(host: &Host, dir: BorrowedFd<'_>, change: impl Fn() -> Result<T>) -> Result<T> {
    let before = host.stats.fd(dir)?;
    let out = hostdir::lending_write(&[dir], change)?;
    let times = SetAttr {
        atime: SetTime::Client(before.atime),
        mtime: SetTime::Client(before.mtime),
        ..SetAttr::default()
    };
    if let Some(times) = hostdir::timestamps(&times) {
        rustix::fs::futimens(dir, &times)?;
    }
    Ok(out)
}

/// Gives the new file `fd`, which is `now`, the owner of `like` (as root);
/// no `chown` where it has that owner already (a root server copying
/// root's files).
fn give_owner(host: &Host, fd: BorrowedFd<'_>, now: &Attr, like: &Attr) -> Result<()> {
    if host.as_root && (now.uid, now.gid) != (like.uid, like.gid) {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(like.uid)),
            Some(rustix::fs::Gid::from_raw(like.gid)),
        )?;
    }
    Ok(())
}

/// Gives the new file `fd` the mode and times of `like`.
fn give_mode_times(fd: BorrowedFd<'_>, like: &Attr) -> Result<()> {
    rustix::fs::fchmod(fd, hostdir::permissions(like.mode))?;
    if let Some(times) = hostdir::timestamps(&times_of(like)) {
        rustix::fs::futimens(fd, &times)?;
    }
    Ok(())
}

/// The access and modification times of `like`, to set.
fn times_of(like: &Attr) -> SetAttr {
    SetAttr {
        atime: SetTime::Client(like.atime),
        mtime: SetTime::Client(like.mtime),
        ..SetAttr::default()
    }
}

/// Gives `name` in `dir` the owner (as root), mode and times of `like`.
pub(super) fn copy_owner_mode_times(
    host: &Host,
    dir: BorrowedFd<'_>,
    name: &CStr,
    like: &Attr,
) -> Result<()> {
    if host.as_root {
        rustix::fs::chownat(
            dir,
            name,
            Some(rustix::fs::Uid::from_raw(like.uid)),
            Some(rustix::fs::Gid::from_raw(like.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )?;
    }
    if like.kind != FileKind::Symlink {
        hostdir::chmod_at(dir, name, hostdir::permissions(like.mode))?;
    }
    hostdir::apply(dir, name, &times_of(like))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// [`copy_sized`] of a file of `len` bytes said to be `said` long, into
    /// a new file (opened for appending with `append`, which the kernel's
    /// copy refuses): the file's bytes and the copy's.
    fn copied(len: usize, said: u64, append: bool) -> (Vec<u8>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("src"), &data).unwrap();
        let src = File::open(dir.path().join("src")).unwrap();
        let dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .append(append)
            .open(dir.path().join("dst"))
            .unwrap();
        copy_sized(src.as_fd(), &dst.into(), said).unwrap();
        let mut got = Vec::new();
        File::open(dir.path().join("dst"))
            .unwrap()
            .read_to_end(&mut got)
            .unwrap();
        (data, got)
    }

    #[test]
    fn a_sized_copy_holds_the_whole_file() {
        for len in [0, 1, 4096, 3 << 20] {
            let (data, got) = copied(len, len as u64, false);
            assert!(got == data, "{len} bytes: {} copied", got.len());
        }
    }

    #[test]
    fn a_file_shorter_than_said_is_copied_as_it_is() {
        let (data, got) = copied(10_000, 20_000, false);
        assert!(got == data, "{} bytes copied", got.len());
    }

    #[test]
    fn where_the_kernel_refuses_its_copy_the_bytes_are_copied_by_hand() {
        let (data, got) = copied(200_000, 200_000, true);
        assert!(got == data, "{} bytes copied", got.len());
    }
}
