//! The part of the stack that reads: the layers, the ids handed out, the
//! inode map and the caches, and how an id or a name is found in the merged
//! tree. Nothing here changes the upper; what does is in [`super::upper`],
//! which takes the namespace lock first. Caches are dropped here, by the
//! changes that make them wrong.

use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use layerfs_vfs::access::{self, Caller, Perm};
use layerfs_vfs::hostdir::{self, cstr, may_change_entries, name_cookie};
use layerfs_vfs::ids::{IdTable, Place, Seen};
use layerfs_vfs::{Attr, Error, FileId, FileKind, KeptFile, Result};

use crate::lazy::Attached;

use super::caches::{Caches, LinkIndex, Listing};
use super::inodes::{Inodes, ROOT};
use super::merge::{Found, Layer, Layers, Listed, Part, UPPER};
use super::order::{Level, Ordered};
use super::whiteouts;

/// The layers, ids, inode map and caches of one stack.
pub(super) struct Tree {
    /// Replaced whole by a commit or a reset (see [`super::order`]).
    layers: RwLock<Arc<Layers>>,
    pub inodes: Inodes,
    pub ids: IdTable,
    pub caches: Caches,
    /// The upper's path and each layer's, top first, as opened.
    pub paths: Mutex<Vec<PathBuf>>,
    /// The lazy layers of the store the stack was opened through.
    lazy: Option<Arc<Attached>>,
}

impl Tree {
    pub fn new(
        layers: Layers,
        inodes: Inodes,
        paths: Vec<PathBuf>,
        lazy: Option<Arc<Attached>>,
    ) -> Tree {
        Tree {
            layers: RwLock::new(Arc::new(layers)),
            inodes,
            ids: IdTable::new(ROOT),
            caches: Caches::for_layers(paths.len()),
            paths: Mutex::new(paths),
            lazy,
        }
    }

    /// Lower file `name` in `dir`, opened for reading: the one way the
    /// stack opens a lower layer's file, so its bytes are read only through
    /// the [`KeptFile`] this gives. Where the stack has lazy layers, a read
    /// first brings in what it needs of a file still waiting for data
    /// ([`crate::lazy`]), or fails with EIO.
    pub fn open_lower(&self, dir: BorrowedFd<'_>, name: &CStr) -> Result<KeptFile> {
        let fd = hostdir::open_regular(dir, name, rustix::fs::OFlags::RDONLY)?;
        Ok(self.kept(Arc::new(fd), false))
    }

    /// Host file `fd`, open in the upper (`in_upper`, which holds all its
    /// data: a copy-up brings every byte in first) or in a lower layer: for
    /// a file kept across a restart, which is no longer found by name.
    pub fn kept(&self, fd: Arc<OwnedFd>, in_upper: bool) -> KeptFile {
        match &self.lazy {
            Some(lazy) if !in_upper => KeptFile::filled_by(fd, lazy.clone()),
            _ => KeptFile::whole(fd),
        }
    }

    /// The stack's directories, bottom first, the upper last.
    pub(super) fn stack(&self) -> Vec<PathBuf> {
        let mut paths = self.paths.lock().clone();
        paths.reverse();
        paths
    }

    pub(super) fn current(&self) -> Arc<Layers> {
        self.read_layers().clone()
    }

    /// Where `id` was last seen, found by walking the merged tree if the
    /// table does not know (an id handed out before a restart).
    pub(super) fn node(&self, layers: &Layers, id: FileId) -> Result<Place> {
        self.ids.place(id, |dir| {
            let parts = self.dir_parts(layers, dir)?;
            Ok(layers
                .list(&self.inodes, &parts)?
                .into_iter()
                .map(|e| Seen {
                    name: e.name,
                    id: e.id,
                    is_dir: e.is_dir,
                })
                .collect())
        })
    }

    pub(super) fn remember(&self, parent: FileId, name: &[u8], id: FileId) {
        self.ids.remember(parent, name, id);
    }

    /// `name` in `parent`, which named `id`, is gone; `links_left` names of
    /// the file stay.
    pub(super) fn unlinked(&self, parent: FileId, name: &[u8], id: FileId, links_left: u32) {
        self.ids.unlinked(parent, name, id, links_left);
        self.dropped_file(id);
    }

    /// Some directory's entries changed: listings are read again.
    pub(super) fn changed_entries(&self) {
        self.caches.entries_changed();
    }

    /// Directories gained or lost parts, or moved: their parts are found again.
    pub(super) fn changed_dirs(&self) {
        self.caches.dirs_changed();
    }

    pub(super) fn dropped_file(&self, id: FileId) {
        self.caches.forget_file(id);
    }

    /// For a change that moves file `id` (copies it up, removes a name of
    /// it, renames over it): when the guard drops, whether the change was
    /// made or failed half way, entries have moved and what is kept of `id`
    /// goes, in that order ([`Caches::keep_located`] relies on it).
    pub(super) fn moving(&self, id: FileId) -> MovingFile<'_> {
        MovingFile { tree: self, id }
    }

    /// The entry `id` names now.
    pub(super) fn found(&self, layers: &Layers, id: FileId) -> Result<Found> {
        if id == ROOT {
            return layers.dir_found(&self.inodes, ROOT, layers.root_parts.clone());
        }
        // A directory's parts stay until directories change.
        if let Some(f) = self.caches.dir(id, layers.generation) {
            let top = &f.parts[0];
            let host = layers.all[top.layer].host.stats.fd(top.fd.as_fd())?;
            let attr = f.shown(host);
            return Ok(Found { host, attr, ..f });
        }
        // Where a file was found, while nothing in the namespace has changed.
        if let Some(f) = self.caches.located(id, layers.generation) {
            let stats = &layers.all[f.layer].host.stats;
            if let Ok(host) = stats.at(f.parent.as_fd(), &f.name) {
                if host.fileid == f.host.fileid {
                    let attr = f.shown(host);
                    return Ok(Found { host, attr, ..f });
                }
            }
        }
        let stamp = self.caches.stamp(layers.generation);
        for attempt in 0..2 {
            let node = self.node(layers, id)?;
            let parts = match self.dir_parts(layers, node.parent) {
                Ok(parts) => parts,
                Err(_) if attempt == 0 => {
                    self.ids.lost(id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let name = hostdir::cstr(&node.name)?;
            match layers.lookup(&self.inodes, &parts, &name)? {
                Some(f) if f.attr.fileid == id => {
                    if f.kind() == FileKind::Directory {
                        self.caches.keep_dir(id, stamp, f.clone());
                    } else {
                        self.caches.keep_located(id, stamp, f.clone());
                    }
                    return Ok(f);
                }
                // Renamed or removed: look for it once more.
                _ => {
                    self.ids.lost(id);
                }
            }
        }
        Err(Error::Stale)
    }

    /// [`found`](Self::found) for an open for writing, which copies a lower
    /// file up and then finds it again: a lower file whose place is kept is
    /// taken as kept, its attributes not asked of the host again. In a
    /// generation a lower file changes in nothing but its access time, and
    /// the copy-up asks for that itself, under the namespace lock.
    pub(super) fn found_to_write(&self, layers: &Layers, id: FileId) -> Result<Found> {
        match self.caches.located(id, layers.generation) {
            Some(f) if f.layer != UPPER => Ok(f),
            _ => self.found(layers, id),
        }
    }

    /// The top part of directory `id`, where it is at hand without a host call.
    pub(super) fn kept_dir_part(&self, layers: &Layers, id: FileId) -> Option<Part> {
        if id == ROOT {
            return layers.root_parts.first().cloned();
        }
        let f = self.caches.dir(id, layers.generation)?;
        f.parts.into_iter().next()
    }

    /// The parts of directory `id`.
    pub(super) fn dir_parts(&self, layers: &Layers, id: FileId) -> Result<Vec<Part>> {
        if id == ROOT {
            return Ok(layers.root_parts.clone());
        }
        if let Some(f) = self.caches.dir(id, layers.generation) {
            return Ok(f.parts);
        }
        let f = self.found(layers, id)?;
        if f.kind() != FileKind::Directory {
            return Err(Error::NotDir);
        }
        Ok(f.parts)
    }

    /// The directory at `path` (components from the root) and the entry
    /// that path names.
    pub(super) fn resolve_path(
        &self,
        layers: &Layers,
        path: &[Vec<u8>],
    ) -> Result<(FileId, Found)> {
        let (last, dirs) = path.split_last().ok_or(Error::Inval)?;
        let mut dir = ROOT;
        for name in dirs {
            let parts = self.dir_parts(layers, dir)?;
            let f = layers
                .lookup(&self.inodes, &parts, &hostdir::cstr(name)?)?
                .ok_or(Error::NoEnt)?;
            self.remember(dir, name, f.attr.fileid);
            dir = f.attr.fileid;
        }
        let parts = self.dir_parts(layers, dir)?;
        let f = layers
            .lookup(&self.inodes, &parts, &hostdir::cstr(last)?)?
            .ok_or(Error::NoEnt)?;
        self.remember(dir, last, f.attr.fileid);
        Ok((dir, f))
    }

    /// The paths, within layer `layer`, of the host file `ino`, when it has
    /// several names. Each layer is walked once, the first time it is asked.
    pub(super) fn links_of(
        &self,
        layers: &Layers,
        layer: usize,
        ino: u64,
    ) -> Result<Vec<Vec<Vec<u8>>>> {
        let index = self
            .caches
            .links(layers.tag(layer), || link_index(&layers.all[layer]))?;
        Ok(index.get(&ino).cloned().unwrap_or_default())
    }

    pub(super) fn read_layers(&self) -> Ordered<RwLockReadGuard<'_, Arc<Layers>>> {
        Ordered::take(Level::Layers, || self.layers.read())
    }

    /// The layers, unless a commit holds them: for hints, which must not wait.
    pub(super) fn try_read_layers(&self) -> Option<RwLockReadGuard<'_, Arc<Layers>>> {
        self.layers.try_read()
    }

    pub(super) fn write_layers(&self) -> Ordered<RwLockWriteGuard<'_, Arc<Layers>>> {
        Ordered::take(Level::Layers, || self.layers.write())
    }

    /// A directory, checked to be one and that `caller` has `want` on it.
    pub(super) fn dir_for(
        &self,
        layers: &Layers,
        caller: &Caller,
        dir: FileId,
        want: Perm,
    ) -> Result<Found> {
        let d = self.found(layers, dir)?;
        if d.kind() != FileKind::Directory {
            return Err(Error::NotDir);
        }
        if !access::permits(&d.attr, caller, want) {
            return Err(Error::Access);
        }
        Ok(d)
    }

    /// What clients see of `host`, an entry whose only instance is in layer
    /// `layer` (a directory merged from several takes its identity from
    /// its bottom part instead).
    pub(super) fn shown(&self, layers: &Layers, layer: usize, host: Attr) -> Result<Attr> {
        let o = self
            .inodes
            .identity(layers.tag(layer), host.fileid, Some(host.generation))?;
        Ok(Attr {
            fileid: o.id,
            generation: o.generation,
            ..host
        })
    }

    /// The attributes of a listed entry: from its only instance in one
    /// call, or by a lookup for a directory merged from several layers.
    pub(super) fn listed_attr(&self, layers: &Layers, d: &Found, e: &Listed) -> Option<Attr> {
        let Some(part) = &e.alone_in else {
            let name = cstr(&e.name).ok()?;
            return layers
                .lookup(&self.inodes, &d.parts, &name)
                .ok()
                .flatten()
                .map(|f| f.attr);
        };
        let lower = part.layer != UPPER;
        if lower {
            if let Some(attr) = self.caches.lower_attr(e.id, layers.generation) {
                return Some(attr);
            }
        }
        let stamp = self.caches.stamp(layers.generation);
        let name = cstr(&e.name).ok()?;
        let host = layers.all[part.layer]
            .host
            .stats
            .at(part.fd.as_fd(), &name)
            .ok()?;
        let attr = self
            .shown(layers, part.layer, host)
            .ok()
            .filter(|attr| attr.fileid == e.id)?;
        if lower {
            self.caches.keep_lower_attr(e.id, stamp, attr);
        }
        Some(attr)
    }

    /// [`Layers::lookup_for_new`] of `name` in directory `d`, for CREATE and
    /// the calls that make an entry, which the host refuses with EEXIST
    /// where the upper already has one. Where no layer below can hold the
    /// name and the caller may add entries, nothing is asked: only the
    /// upper might hold it, and it has no whiteout of it (one is made only
    /// over a name below).
    pub(super) fn lookup_to_make(
        &self,
        layers: &Layers,
        caller: &Caller,
        d: &Found,
        name: &CStr,
    ) -> Result<(Option<Found>, bool)> {
        if may_change_entries(caller, &d.attr).is_ok()
            && !layers.below_may_hold(&d.parts, name.to_bytes())
        {
            return Ok((None, false));
        }
        layers.lookup_for_new(&self.inodes, &d.parts, name)
    }

    /// The attributes `name` shows in directory `dir` (found as `d`):
    /// kept where only a change this process makes can alter them (see
    /// `caches.rs`), so a name an image holds, or one that is nowhere, costs
    /// no host call the second time.
    pub(super) fn look_up(
        &self,
        layers: &Layers,
        dir: FileId,
        d: &Found,
        name: &[u8],
    ) -> Result<Attr> {
        if let Some(kept) = self.caches.looked_up(dir, name, layers.generation) {
            return kept.ok_or(Error::NoEnt);
        }
        let stamp = self.caches.stamp(layers.generation);
        let Some(f) = layers.lookup(&self.inodes, &d.parts, &cstr(name)?)? else {
            self.caches.keep_looked_up(dir, name, stamp, None);
            return Err(Error::NoEnt);
        };
        // An upper file's attributes change with every write, which moves
        // no counter.
        if f.layer != UPPER {
            self.caches.keep_looked_up(dir, name, stamp, Some(f.attr));
        }
        // Where it was found, as [`Tree::found`] keeps it: the open or
        // GETATTR that follows a lookup finds it without a second walk.
        let attr = f.attr;
        if f.kind() == FileKind::Directory {
            self.caches.keep_dir(attr.fileid, stamp, f);
        } else {
            self.caches.keep_located(attr.fileid, stamp, f);
        }
        Ok(attr)
    }

    pub(super) fn listing(&self, layers: &Layers, dir: FileId, d: &Found) -> Result<Listing> {
        if let Some(listing) = self.caches.listing(dir, layers.generation) {
            return Ok(listing);
        }
        let stamp = self.caches.stamp(layers.generation);
        let mut entries: Vec<(u64, Listed)> = layers
            .list(&self.inodes, &d.parts)?
            .into_iter()
            .map(|e| {
                self.remember(dir, &e.name, e.id);
                (name_cookie(&e.name), e)
            })
            .collect();
        entries.sort_unstable_by_key(|e| e.0);
        let listing = Arc::new(entries);
        self.caches.keep_listing(dir, stamp, listing.clone());
        Ok(listing)
    }
}

/// Host inode → paths of the regular files with several names in `layer`.
fn link_index(layer: &Layer) -> Result<LinkIndex> {
    let mut index = LinkIndex::new();
    let mut queue = VecDeque::from([(layer.root.clone(), Vec::<Vec<u8>>::new())]);
    while let Some((fd, path)) = queue.pop_front() {
        for (name, ino, is_dir) in hostdir::list(fd.as_fd())? {
            if whiteouts::is_hidden(&name) {
                continue;
            }
            let cname = hostdir::cstr(&name)?;
            let mut child = path.clone();
            child.push(name);
            if is_dir {
                let sub = hostdir::open_dir(fd.as_fd(), &cname)?;
                queue.push_back((Arc::new(sub), child));
                continue;
            }
            let attr = layer.host.stats.at(fd.as_fd(), &cname)?;
            if attr.kind == FileKind::Regular && attr.nlink > 1 {
                index.entry(ino).or_default().push(child);
            }
        }
    }
    Ok(index)
}

/// A change to one file under way ([`Tree::moving`]).
pub(super) struct MovingFile<'a> {
    tree: &'a Tree,
    id: FileId,
}

impl Drop for MovingFile<'_> {
    fn drop(&mut self) {
        self.tree.changed_entries();
        self.tree.dropped_file(self.id);
    }
}
