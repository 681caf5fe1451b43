//! The part of the stack that changes the upper: the namespace lock, the
//! per-file write stripes, the work directory copies are staged in, the
//! size limit, and what copy-ups have not made durable yet.
//!
//! A change of names or a copy-up is made through a [`Changing`], which
//! holds the namespace lock over the layers it read: what needs the lock
//! cannot be called without it. Its copy-up half is in [`super::copy_up`];
//! removals, which leave whiteouts, are here.

use parking_lot::{Mutex, MutexGuard};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use layerfs_vfs::hostdir;
use layerfs_vfs::stripes::Stripes;
use layerfs_vfs::{Error, FileId, FileKind, Result};
use rustix::fs::AtFlags;

use super::inodes::Inodes;
use super::merge::{Found, Layers, UPPER};
use super::order::{Level, Ordered};
use super::quota::Quota;
use super::tree::Tree;
use super::whiteouts::{clear_markers, mark_opaque, whiteout};

/// What copy-ups have not made durable yet.
#[derive(Default)]
pub(super) struct Unsynced {
    /// Upper directories with entries renamed in and not yet synced (a leaf
    /// lock: nothing is taken while it is held).
    pub dirs: Mutex<Vec<Arc<OwnedFd>>>,
    /// The upper's filesystem refused a clone (no reflink): not tried again.
    #[cfg(target_os = "linux")]
    pub no_clone: std::sync::atomic::AtomicBool,
}

/// A name in the work directory, removed when dropped unless it was renamed
/// into place first: a copy that failed half way (a full disk) leaves nothing.
pub(super) struct Staged<'a> {
    pub work: BorrowedFd<'a>,
    pub name: std::ffi::CString,
    pub dir: bool,
    /// Renamed into place: nothing to remove.
    pub placed: bool,
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if self.placed {
            return;
        }
        let flags = if self.dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        if self.dir {
            // Only markers can be inside.
            if let Ok(fd) = hostdir::open_dir(self.work, &self.name) {
                let _ = super::whiteouts::clear_markers(fd.as_fd());
            }
        }
        let _ = rustix::fs::unlinkat(self.work, &self.name, flags);
    }
}

/// What changes the upper, and the locks that order those changes.
pub(super) struct Upper {
    /// Serialises changes to the namespace, and copy-ups.
    ns: Mutex<()>,
    /// Serialise writes per file, with their before and after attributes.
    stripes: Stripes,
    /// Where copies are staged, on the upper's filesystem.
    pub work: OwnedFd,
    /// The directory holding `work`, the inode map and the commit journal.
    pub state: PathBuf,
    /// Held while this stack serves the upper: see [`super::IN_USE`].
    _serving: OwnedFd,
    staged: AtomicU64,
    /// The limit on what the upper holds, if any.
    pub quota: Quota,
    /// What copy-ups left to make durable at the next point that promises it.
    pub unsynced: Unsynced,
}

/// The namespace lock, held over the layers a change reads: names are
/// made, removed and copied up through this alone.
pub(super) struct Changing<'a> {
    pub tree: &'a Tree,
    pub upper: &'a Upper,
    pub layers: &'a Layers,
    _ns: Ordered<MutexGuard<'a, ()>>,
}

impl Upper {
    pub fn new(work: OwnedFd, state: PathBuf, serving: OwnedFd) -> Upper {
        Upper {
            ns: Mutex::new(()),
            stripes: Stripes::default(),
            work,
            state,
            _serving: serving,
            staged: AtomicU64::new(0),
            quota: Quota::default(),
            unsynced: Unsynced::default(),
        }
    }

    /// Takes the namespace lock for a change over `layers` (read or written
    /// by the caller: the lock order puts them first).
    pub fn changing<'a>(&'a self, tree: &'a Tree, layers: &'a Layers) -> Changing<'a> {
        Changing {
            tree,
            upper: self,
            layers,
            _ns: self.lock_ns(),
        }
    }

    /// The namespace lock alone, for a commit, a diff or a reset: each
    /// holds the layers for writing, to replace them or see them still.
    pub fn lock_ns(&self) -> Ordered<MutexGuard<'_, ()>> {
        Ordered::take(Level::Ns, || self.ns.lock())
    }

    /// Takes the write stripe of `id`, for a change of its data.
    pub fn lock_stripe(&self, id: FileId) -> Ordered<MutexGuard<'_, ()>> {
        Ordered::take(Level::Stripe, || self.stripes.lock(id))
    }

    /// A fresh name in the work directory, for a file or a directory.
    pub fn stage(&self, dir: bool) -> Staged<'_> {
        let n = self.staged.fetch_add(1, Relaxed);
        Staged {
            work: self.work.as_fd(),
            name: std::ffi::CString::new(format!("t{n}")).expect("no NUL"),
            dir,
            placed: false,
        }
    }

    /// Makes every copy-up so far durable: their identities' records first
    /// (a record of a copy that is not in place is never used), then the
    /// directories they were renamed into. Called wherever a caller is
    /// promised durability (see the module doc).
    pub fn make_durable(&self, inodes: &Inodes) -> Result<()> {
        inodes.sync()?;
        let dirs = std::mem::take(&mut *self.unsynced.dirs.lock());
        for (i, dir) in dirs.iter().enumerate() {
            if let Err(e) = hostdir::sync_all(dir.as_fd()) {
                // Synced again next time.
                self.unsynced.dirs.lock().extend_from_slice(&dirs[i..]);
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Changing<'_> {
    /// Removes `name` (found as `f`) from directory `d`, leaving a whiteout
    /// where a lower layer would show through.
    pub fn unlink_entry(&self, dir: FileId, d: &Found, f: &Found, name: &[u8]) -> Result<()> {
        let (tree, layers) = (self.tree, self.layers);
        if f.layer != UPPER && f.kind() == FileKind::Regular && f.host.nlink > 1 {
            // Its other names lose a link: they become one upper file first.
            tree.remember(dir, name, f.attr.fileid);
            self.copy_up(f.attr.fileid)?;
            let d = tree.found(layers, dir)?;
            let f = layers
                .lookup(&tree.inodes, &d.parts, &f.name)?
                .ok_or(Error::Io)?;
            return self.unlink_entry(dir, &d, &f, name);
        }
        let _moving = tree.moving(f.attr.fileid);
        let below = f.layer != UPPER || layers.shows_below(&d.parts, UPPER, &f.name)?;
        let up = self.upper_dir_of(dir, d)?;
        if f.layer == UPPER && f.kind() == FileKind::Directory {
            let child = f.parts[0].fd.as_fd();
            if below {
                // Empty and opaque first: it shows nothing from then on.
                mark_opaque(child)?;
                whiteout(up.as_fd(), name)?;
            }
            clear_markers(child)?;
            rustix::fs::unlinkat(&*up, &f.name, AtFlags::REMOVEDIR)?;
            tree.inodes.forget(layers.tag(UPPER), f.host.fileid);
        } else if f.layer == UPPER {
            if below {
                whiteout(up.as_fd(), name)?;
            }
            rustix::fs::unlinkat(&*up, &f.name, AtFlags::empty())?;
            if f.host.nlink <= 1 {
                tree.inodes.forget(layers.tag(UPPER), f.host.fileid);
            }
        } else {
            whiteout(up.as_fd(), name)?;
        }
        if f.kind() == FileKind::Directory {
            tree.changed_dirs();
        }
        tree.changed_entries();
        tree.unlinked(dir, name, f.attr.fileid, links_left(f));
        Ok(())
    }
}

/// The names a file keeps once one is removed.
pub(super) fn links_left(f: &Found) -> u32 {
    match f.kind() {
        FileKind::Directory => 0,
        _ => f.host.nlink.saturating_sub(1),
    }
}
