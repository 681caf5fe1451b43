//! Directory ids by place, for hosts that do not keep inode numbers.
//!
//! Where a directory's inode number changes while it exists (overlayfs over
//! several filesystems renumbers a directory each time its cache entry is
//! evicted), a directory's id is given by where it is: a hash of its parent's
//! id and its name, the first time it is seen there. The id follows the
//! directory through renames made here and is never given to a later
//! directory at the same place while the old id is remembered. After a
//! restart, ids are hashed again from places, so handles of directories that
//! never moved keep working; those of directories renamed or replaced before
//! the restart are stale.

use parking_lot::Mutex;
use std::collections::HashMap;

use crate::FileId;

/// Directories' ids have the top bit set; other files' never do.
const DIR_BIT: u64 = 1 << 63;

/// The export root's id.
pub const ROOT: FileId = DIR_BIT;

/// A directory's parent and name.
type At = (FileId, Box<[u8]>);

#[derive(Default)]
pub struct DirPlaces {
    ids: Mutex<HashMap<At, FileId>>,
}

impl DirPlaces {
    /// The id of the directory `name` in `parent`: the one it has, or a new
    /// one from its place that `taken` does not refuse.
    pub fn id(&self, parent: FileId, name: &[u8], taken: impl Fn(FileId) -> bool) -> FileId {
        let mut ids = self.ids.lock();
        if let Some(&id) = ids.get(&(parent, name.into())) {
            return id;
        }
        let id = (0u64..)
            .map(|salt| DIR_BIT | place_hash(parent, name, salt))
            .find(|&id| id != ROOT && !taken(id))
            .expect("an id is free");
        ids.insert((parent, name.into()), id);
        id
    }

    /// The directory `id` moved from one place to another.
    pub fn moved(&self, from: (FileId, &[u8]), to: (FileId, &[u8]), id: FileId) {
        let mut ids = self.ids.lock();
        ids.remove(&(from.0, from.1.into()));
        ids.insert((to.0, to.1.into()), id);
    }

    /// The directory at this place was removed.
    pub fn removed(&self, parent: FileId, name: &[u8]) {
        self.ids.lock().remove(&(parent, name.into()));
    }
}

/// FNV-1a over the parent id, the name and a salt, below the top bit: the
/// same in every run and every build.
fn place_hash(parent: FileId, name: &[u8], salt: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = parent.to_le_bytes().into_iter().chain(name.iter().copied());
    for b in bytes.chain(salt.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h & !DIR_BIT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_kept_by_place_moves_with_its_directory_and_is_not_reused() {
        let places = DirPlaces::default();
        let a = places.id(ROOT, b"a", |_| false);
        assert_eq!(places.id(ROOT, b"a", |_| true), a);
        assert_ne!(a & DIR_BIT, 0);
        // The same place hashes to the same id in a new run.
        assert_eq!(DirPlaces::default().id(ROOT, b"a", |_| false), a);
        places.moved((ROOT, b"a"), (ROOT, b"b"), a);
        assert_eq!(places.id(ROOT, b"b", |_| true), a);
        // A new directory where `a` was gets another id while `a` lives.
        let again = places.id(ROOT, b"a", |id| id == a);
        assert_ne!(again, a);
        places.removed(ROOT, b"b");
        assert_ne!(places.id(ROOT, b"b", |id| id == a), a);
    }
}
