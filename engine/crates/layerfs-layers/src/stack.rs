//! [`StackFs`]: the [`Filesystem`](layerfs_vfs::Filesystem) over a stack of
//! read-only layers under one private writable upper.
//!
//! It is two parts. [`tree`] reads: files are found as in
//! [`layerfs_vfs::LocalFs`], a table mapping each id handed out to its
//! parent and name, and an id it does not know (after a restart) is found
//! again by walking the merged tree; what a name shows is decided by
//! [`merge`], ids come from [`inodes`]. [`upper`] changes: names are made
//! and removed, and lower files copied up ([`copy_up`]) first, under the
//! namespace lock it hands out. The upper is private: nothing but this
//! changes it, so caches are dropped exactly when this changes what they
//! hold. The order its locks are taken in is written (and checked in debug
//! builds) in [`order`].

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerfs_vfs::hostdir::{self, Host};
use layerfs_vfs::Result;
use rustix::fs::{Mode, OFlags};

use crate::lazy::Attached;

mod caches;
mod commit;
mod copy_up;
mod diff;
mod dir_index;
mod inodes;
mod merge;
mod ops;
mod order;
mod origin_log;
mod quota;
mod removed;
mod reset;
mod tree;
mod upper;
mod whiteouts;
mod xattrs;

pub use diff::{Change, ChangeKind};
use dir_index::Indexes;
use inodes::Inodes;
use merge::{Layer, Layers, UPPER};
pub use quota::ENTRY_CHARGE;
pub use reset::ResetDone;
use tree::Tree;
use upper::{Changing, Upper};

/// Why a second `StackFs` cannot serve an upper that one already serves.
pub const IN_USE: &str = "already served by another layerfs (over NFS or FUSE); \
                          one door at a time may serve a workspace";

/// Why a layer or upper on a filesystem without stable inode numbers is refused.
pub const UNSTABLE_INODES: &str = "its filesystem does not keep inode numbers (an overlay \
across filesystems, 9p, FUSE?); put the layers and the upper on ext4, xfs, btrfs or tmpfs";

/// Where a served upper keeps its state (inode map, copy-up staging, files
/// removed while open): a whiteout-style name, so never shown.
pub const STATE_IN_UPPER: &str = ".wh..wh..layerfs";

/// A stack of layers served as one [`Filesystem`](layerfs_vfs::Filesystem):
/// what reads it and what changes it, each with its own locks.
pub struct StackFs {
    tree: Tree,
    upper: Upper,
    removed: removed::Removed,
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
    /// A lazy layer of a store whose data is still coming is refused here:
    /// [`Store::open_stack`](crate::Store::open_stack) opens it.
    pub fn open(lowers: &[PathBuf], upper: &Path, state: &Path) -> io::Result<StackFs> {
        Self::open_with(lowers, upper, state, None)
    }

    /// [`StackFs::open`], reading lazy layers attached in `lazy`.
    pub(crate) fn open_with(
        lowers: &[PathBuf],
        upper: &Path,
        state: &Path,
        lazy: Option<Arc<Attached>>,
    ) -> io::Result<StackFs> {
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
            crate::remove_tree(&work_path).map_err(|e| at(&work_path, &e))?;
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
            let path = lower.canonicalize().map_err(|e| at(lower, &e))?;
            crate::store::check_gated(&path, lazy.as_deref())?;
            paths.push(path);
        }
        let layers = Self::layers_at(&inodes, &paths, 0).map_err(|e| at(upper, &e))?;
        let upper_dev = rustix::fs::fstat(&*layers.all[UPPER].root)?.st_dev;
        if rustix::fs::fstat(&work)?.st_dev != upper_dev {
            return Err(at(state, &"not on the upper's filesystem"));
        }
        let removed = removed::Removed::open(state).map_err(|e| at(state, &e))?;
        Ok(StackFs {
            tree: Tree::new(layers, inodes, paths, lazy),
            upper: Upper::new(work, state.to_path_buf(), serving),
            removed,
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
        self.tree.stack()
    }

    /// Takes the namespace lock for a change over `layers`.
    fn changing<'a>(&'a self, layers: &'a Layers) -> Changing<'a> {
        self.upper.changing(&self.tree, layers)
    }

    /// Makes every copy-up so far durable (see [`copy_up`]).
    fn make_durable(&self) -> Result<()> {
        self.upper.make_durable(&self.tree.inodes)
    }
}
