//! [`StackFs`]: the [`Filesystem`](layerfs_vfs::Filesystem) over a stack of
//! read-only layers under one private writable upper.
//!
//! Files are found as in [`layerfs_vfs::LocalFs`]: a table maps each id handed
//! out to its parent and name, and an id it does not know (after a restart)
//! is found again by walking the merged tree. What a name shows is decided by
//! [`merge`]; ids come from [`inodes`]; changes to lower files go through
//! [`copy_up`] first. The upper is private: nothing but this changes it, so
//! caches are dropped exactly when this changes what they hold. The order
//! its locks are taken in is written (and checked in debug builds) in
//! [`order`].

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use layerfs_vfs::hostdir::{self, Host};
use layerfs_vfs::ids::{IdTable, Place, Seen};
use layerfs_vfs::stripes::Stripes;
use layerfs_vfs::{Error, FileId, FileKind, Result};
use rustix::fs::{Mode, OFlags};

mod caches;
mod commit;
mod copy_up;
mod diff;
mod inodes;
mod merge;
mod ops;
mod order;
mod origin_log;
mod quota;
mod reset;
mod whiteouts;
mod xattrs;

use caches::{Caches, Indexes, LinkIndex, Listing};
pub use diff::{Change, ChangeKind};
use inodes::{Inodes, ROOT};
use merge::{Found, Layer, Layers, Part, UPPER};
use order::{Level, Ordered};
pub use quota::ENTRY_CHARGE;
pub use reset::ResetDone;

/// Why a second `StackFs` cannot serve an upper that one already serves.
pub const IN_USE: &str = "already served by another layerfs (over NFS or FUSE); \
                          one door at a time may serve a workspace";

/// Why a layer or upper on a filesystem without stable inode numbers is refused.
pub const UNSTABLE_INODES: &str = "its filesystem does not keep inode numbers (an overlay \
across filesystems, 9p, FUSE?); put the layers and the upper on ext4, xfs, btrfs or tmpfs";

/// Where a served upper keeps its state (inode map, copy-up staging): a
/// whiteout-style name, so never shown.
pub const STATE_IN_UPPER: &str = ".wh..wh..layerfs";

pub struct StackFs {
    layers: RwLock<Arc<Layers>>,
    inodes: Inodes,
    /// Serialises changes to the namespace, and copy-ups.
    ns: Mutex<()>,
    ids: IdTable,
    /// Serialise writes per file, with their before and after attributes.
    stripes: Stripes,
    caches: Caches,
    /// Where copies are staged, on the upper's filesystem.
    work: OwnedFd,
    /// The directory holding `work`, the inode map and the commit journal.
    state: PathBuf,
    /// Held while this `StackFs` serves the upper: see [`IN_USE`].
    _serving: OwnedFd,
    staged: AtomicU64,
    /// The upper's path and each layer's, top first, as opened.
    paths: Mutex<Vec<PathBuf>>,
    /// The limit on what the upper holds, if any.
    quota: quota::Quota,
    /// What copy-ups left to make durable at the next point that promises it.
    unsynced: copy_up::Unsynced,
}

fn open_root(path: &Path) -> Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn tag_key(path: &Path) -> Vec<u8> {
    path.as_os_str().as_encoded_bytes().to_vec()
}

impl StackFs {
    /// Serves `lowers` (bottom first) under the writable `upper`, keeping
    /// the inode map and staging copies in `state`, which must be on the
    /// upper's filesystem. The upper and state directories are made if missing.
    pub fn open(lowers: &[PathBuf], upper: &Path, state: &Path) -> io::Result<StackFs> {
        let at = |what: &Path, e: &dyn std::fmt::Display| {
            io::Error::other(format!("{}: {e}", what.display()))
        };
        std::fs::create_dir_all(upper).map_err(|e| at(upper, &e))?;
        // Ids are derived from host inode numbers: a filesystem that
        // renumbers files (overlayfs across filesystems, 9p, most FUSE
        // filesystems) would turn handles stale under clients. Refused
        // before any state is made.
        for path in lowers.iter().map(PathBuf::as_path).chain([upper]) {
            let root = open_root(path).map_err(|e| at(path, &e))?;
            if !hostdir::keeps_inode_numbers(root.as_fd()) {
                return Err(at(path, &UNSTABLE_INODES));
            }
        }
        std::fs::create_dir_all(state).map_err(|e| at(state, &e))?;
        let serving = Self::claim(state).map_err(|e| at(upper, &e))?;
        let work_path = state.join("work");
        // Copies a crash left half made: never renamed into place, so unseen.
        if work_path.exists() {
            std::fs::remove_dir_all(&work_path).map_err(|e| at(&work_path, &e))?;
        }
        std::fs::create_dir(&work_path).map_err(|e| at(&work_path, &e))?;
        let work = open_root(&work_path).map_err(|e| at(&work_path, &e))?;
        commit::recover(
            state,
            &upper.canonicalize()?,
            lowers.last().map(PathBuf::as_path),
            work.as_fd(),
        )
        .map_err(|e| at(state, &format!("finishing a commit cut short: {e}")))?;
        let map = state.join("inodes.redb");
        let inodes = Inodes::open(&map).map_err(|e| at(&map, &e))?;
        let mut paths = vec![upper.canonicalize()?];
        for lower in lowers.iter().rev() {
            paths.push(lower.canonicalize().map_err(|e| at(lower, &e))?);
        }
        let layers = Self::layers_at(&inodes, &paths, 0).map_err(|e| at(upper, &e))?;
        let upper_dev = rustix::fs::fstat(&*layers.all[UPPER].root)?.st_dev;
        if rustix::fs::fstat(&work)?.st_dev != upper_dev {
            return Err(at(state, &"not on the upper's filesystem"));
        }
        Ok(StackFs {
            layers: RwLock::new(Arc::new(layers)),
            inodes,
            ns: Mutex::new(()),
            ids: IdTable::new(ROOT),
            stripes: Stripes::default(),
            caches: Caches::for_layers(paths.len()),
            work,
            state: state.to_path_buf(),
            _serving: serving,
            staged: AtomicU64::new(0),
            paths: Mutex::new(paths),
            quota: quota::Quota::default(),
            unsynced: copy_up::Unsynced::default(),
        })
    }

    /// Takes the lock that lets one `StackFs` at a time, in any process,
    /// serve the upper kept by `state`: two would each trust caches the other
    /// makes stale, and each would clear the other's half-made copies. The
    /// kernel drops the lock with its holder, so a crash leaves none behind.
    fn claim(state: &Path) -> io::Result<OwnedFd> {
        let path = state.join("serving.lock");
        let fd = rustix::fs::open(
            &path,
            OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        // A lock just let go may still be held a moment by a child forked
        // with the descriptor and not yet exec'd (its copy closes at exec):
        // asked again for up to a second before the upper is called in use.
        for _ in 0..20 {
            match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(fd),
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    std::thread::sleep(std::time::Duration::from_millis(50))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(io::Error::other(IN_USE))
    }

    /// Serves `lowers` under `upper` with the state kept inside the upper,
    /// in a directory clients never see.
    pub fn open_in_upper(lowers: &[PathBuf], upper: &Path) -> io::Result<StackFs> {
        std::fs::create_dir_all(upper)?;
        Self::open(lowers, upper, &upper.join(STATE_IN_UPPER))
    }

    fn layers_at(inodes: &Inodes, paths: &[PathBuf], generation: u64) -> Result<Layers> {
        let mut all = Vec::with_capacity(paths.len());
        for path in paths {
            let root = open_root(path)?;
            all.push(Layer {
                tag: inodes.tag(&tag_key(path))?,
                host: Host::for_dir(root.as_fd()),
                root: Arc::new(root),
            });
        }
        let mut layers = Layers {
            all,
            indexes: Indexes::default(),
            generation,
            root_parts: Vec::new(),
        };
        layers.root_parts = layers.find_root_parts()?;
        Ok(layers)
    }

    /// The stack's directories, bottom first, the upper last.
    pub fn stack(&self) -> Vec<PathBuf> {
        let mut paths = self.paths.lock().clone();
        paths.reverse();
        paths
    }

    fn current(&self) -> Arc<Layers> {
        self.read_layers().clone()
    }

    /// Where `id` was last seen, found by walking the merged tree if the
    /// table does not know (an id handed out before a restart).
    fn node(&self, layers: &Layers, id: FileId) -> Result<Place> {
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

    fn remember(&self, parent: FileId, name: &[u8], id: FileId) {
        self.ids.remember(parent, name, id);
    }

    /// `name` in `parent`, which named `id`, is gone; `links_left` names of
    /// the file stay.
    fn unlinked(&self, parent: FileId, name: &[u8], id: FileId, links_left: u32) {
        self.ids.unlinked(parent, name, id, links_left);
        self.dropped_file(id);
    }

    /// Some directory's entries changed: listings are read again.
    fn changed_entries(&self) {
        self.caches.entries_changed();
    }

    /// Directories gained or lost parts, or moved: their parts are found again.
    fn changed_dirs(&self) {
        self.caches.dirs_changed();
    }

    fn dropped_file(&self, id: FileId) {
        self.caches.forget_file(id);
    }

    /// The entry `id` names now.
    fn found(&self, layers: &Layers, id: FileId) -> Result<Found> {
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

    /// The parts of directory `id`.
    fn dir_parts(&self, layers: &Layers, id: FileId) -> Result<Vec<Part>> {
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
    fn resolve_path(&self, layers: &Layers, path: &[Vec<u8>]) -> Result<(FileId, Found)> {
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
    fn links_of(&self, layers: &Layers, layer: usize, ino: u64) -> Result<Vec<Vec<Vec<u8>>>> {
        let index = self
            .caches
            .links(layers.tag(layer), || link_index(&layers.all[layer]))?;
        Ok(index.get(&ino).cloned().unwrap_or_default())
    }

    fn read_layers(&self) -> Ordered<RwLockReadGuard<'_, Arc<Layers>>> {
        Ordered::take(Level::Layers, || self.layers.read())
    }

    fn write_layers(&self) -> Ordered<RwLockWriteGuard<'_, Arc<Layers>>> {
        Ordered::take(Level::Layers, || self.layers.write())
    }

    fn lock_stripe(&self, id: FileId) -> Ordered<MutexGuard<'_, ()>> {
        Ordered::take(Level::Stripe, || self.stripes.lock(id))
    }

    fn lock_ns(&self) -> Ordered<MutexGuard<'_, ()>> {
        Ordered::take(Level::Ns, || self.ns.lock())
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
