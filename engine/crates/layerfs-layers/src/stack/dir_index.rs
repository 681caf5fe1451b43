//! A lower directory's entries, read once (layers never change), and the
//! bounded cache of them the merge consults before it asks the host.

use std::collections::{HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use layerfs_vfs::hostdir;
use layerfs_vfs::Result;
use parking_lot::Mutex;

use super::whiteouts::{named, Named};

/// A lower directory's entries, read once: layers never change.
#[derive(Default)]
pub struct DirIndex {
    /// Name → host inode number, and whether it is a directory.
    pub(super) entries: HashMap<Box<[u8]>, (u64, bool)>,
    /// Names whited out here.
    pub(super) whiteouts: HashSet<Box<[u8]>>,
    /// Holds the opaque marker.
    pub(super) opaque: bool,
}

impl DirIndex {
    /// Whether it holds `name` (not a whiteout of it).
    pub fn holds(&self, name: &[u8]) -> bool {
        self.entries.contains_key(name)
    }

    /// The names it keeps, markers counted: what it costs to keep.
    pub fn names(&self) -> usize {
        self.entries.len() + self.whiteouts.len() + 1
    }
}

impl DirIndex {
    pub(super) fn read(dir: BorrowedFd<'_>) -> Result<DirIndex> {
        let mut index = DirIndex::default();
        for (name, ino, is_dir) in hostdir::list(dir)? {
            match named(&name) {
                Named::Opaque => index.opaque = true,
                Named::Whiteout(hidden) => {
                    index.whiteouts.insert(hidden.into());
                }
                Named::Shown => {
                    index.entries.insert(name.into(), (ino, is_dir));
                }
            }
        }
        Ok(index)
    }
}

/// Names of lower directories kept in their indexes (some 80 bytes each);
/// past this the indexes start over.
const INDEXED_NAMES: usize = 256 * 1024;

/// The lower directories' indexes kept, by layer and host inode, bounded
/// by the names they hold (one directory of a million names costs what a
/// million directories of one do). Lower layers never change, so an index
/// is never stale; a new generation of layers gets a new `Indexes`.
#[derive(Default)]
pub struct Indexes(Mutex<KeptIndexes>);

#[derive(Default)]
struct KeptIndexes {
    by_dir: HashMap<(usize, u64), Arc<DirIndex>>,
    names: usize,
}

impl Indexes {
    pub fn get(&self, key: (usize, u64)) -> Option<Arc<DirIndex>> {
        self.0.lock().by_dir.get(&key).cloned()
    }

    /// Whether the directory `key` may hold `name`: `true` unless its index
    /// is kept and says not.
    pub fn may_hold(&self, key: (usize, u64), name: &[u8]) -> bool {
        self.0
            .lock()
            .by_dir
            .get(&key)
            .is_none_or(|index| index.holds(name))
    }

    pub fn keep(&self, key: (usize, u64), index: Arc<DirIndex>) {
        let size = index.names();
        let mut kept = self.0.lock();
        if kept.names + size > INDEXED_NAMES {
            kept.by_dir.clear();
            kept.names = 0;
        }
        kept.names += size;
        kept.by_dir.insert(key, index);
    }
}
