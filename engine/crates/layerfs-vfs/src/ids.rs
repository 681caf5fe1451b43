//! The id table: where each id handed out to a client was last seen.
//!
//! A door addresses files by id; a filesystem kept in host directories finds
//! them by parent and name. The table maps each id to the place it was last
//! seen, keeps the ids known to be gone (so a client asking again and again
//! about a removed file is answered STALE without a search), and finds an id
//! it does not know (one handed out before a restart) by walking the tree
//! once. [`crate::LocalFs`] and the layered filesystem both keep one.
//!
//! The one rule for removals: an id is gone only when its file has no name
//! left. Removing one name of a hard-linked file forgets that place only, and
//! the file is found again under another name.

use parking_lot::{Mutex, RwLock};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::bounded::BoundedMap;
use crate::error::{Error, Result};
use crate::FileId;

/// Ids known to be gone that are kept; past this the set starts over.
const GONE_KEPT: usize = 65_536;

/// Where an id was last seen: its directory and its name there (shared, so
/// that handing out a place copies no name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub parent: FileId,
    pub name: Arc<[u8]>,
}

/// One entry met by a walk.
pub struct Seen {
    pub name: Box<[u8]>,
    pub id: FileId,
    pub is_dir: bool,
}

pub struct IdTable {
    root: FileId,
    /// Ids are this process's (host inode numbers or its own), not values a
    /// client chooses, so an unkeyed fast hash is safe here.
    places: RwLock<FxHashMap<FileId, Place>>,
    gone: Mutex<BoundedMap<FileId, (), rustc_hash::FxBuildHasher>>,
    walks: AtomicU64,
}

impl IdTable {
    pub fn new(root: FileId) -> IdTable {
        IdTable {
            root,
            places: RwLock::new(FxHashMap::default()),
            gone: Mutex::new(BoundedMap::new(GONE_KEPT)),
            walks: AtomicU64::new(0),
        }
    }

    /// Where `id` was last seen, if the table knows.
    pub fn get(&self, id: FileId) -> Option<Place> {
        self.places.read().get(&id).cloned()
    }

    /// Whether `id` is found without a walk: the root, known, or known gone.
    pub fn knows(&self, id: FileId) -> bool {
        id == self.root || self.get(id).is_some() || self.is_gone(id)
    }

    /// Whether `id` is known to name no file.
    pub fn is_gone(&self, id: FileId) -> bool {
        self.gone.lock().contains_key(&id)
    }

    /// Where `id` is: known, known to be gone (`Stale`), or found by walking
    /// the tree with `list`, which gives a directory's entries.
    pub fn place(
        &self,
        id: FileId,
        list: impl FnMut(FileId) -> Result<Vec<Seen>>,
    ) -> Result<Place> {
        if let Some(place) = self.get(id) {
            return Ok(place);
        }
        // A client keeps asking about files it removed (stale handles):
        // answer those without walking the whole tree each time.
        if self.is_gone(id) {
            return Err(Error::Stale);
        }
        self.find(id, list)
    }

    /// Records that `id` is `name` in `parent` (and so is not gone).
    pub fn remember(&self, parent: FileId, name: &[u8], id: FileId) {
        if id == self.root {
            return;
        }
        self.gone.lock().remove(&id);
        // A LOOKUP of a name looked up before takes no write lock.
        if self.is_at(id, parent, name) {
            return;
        }
        let place = Place {
            parent,
            name: name.into(),
        };
        self.places.write().insert(id, place);
    }

    /// Whether `id` was last seen as `name` in `parent`.
    fn is_at(&self, id: FileId, parent: FileId, name: &[u8]) -> bool {
        self.places
            .read()
            .get(&id)
            .is_some_and(|p| p.parent == parent && *p.name == *name)
    }

    /// Records that `id` names no file any more.
    pub fn forget(&self, id: FileId) {
        self.gone.lock().insert(id, ());
        self.places.write().remove(&id);
    }

    /// The name `name` of `parent` was removed (or replaced) and `id`, the
    /// file it named, has `links_left` names still. The id is gone only when
    /// none are left; otherwise only this place is forgotten, if it was the
    /// one kept, and the file is found again under another name.
    pub fn unlinked(&self, parent: FileId, name: &[u8], id: FileId, links_left: u32) {
        if links_left == 0 {
            return self.forget(id);
        }
        let mut places = self.places.write();
        if places
            .get(&id)
            .is_some_and(|p| p.parent == parent && *p.name == *name)
        {
            places.remove(&id);
        }
    }

    /// Drops what is known of where `id` is (it moved behind the table's
    /// back); the next look for it walks.
    pub fn lost(&self, id: FileId) {
        self.places.write().remove(&id);
    }

    /// Walks the tree breadth first, remembering what it passes, until it
    /// meets `id`; a miss marks `id` gone.
    fn find(&self, id: FileId, mut list: impl FnMut(FileId) -> Result<Vec<Seen>>) -> Result<Place> {
        self.walks.fetch_add(1, Relaxed);
        let mut queue = VecDeque::from([self.root]);
        // Each directory is listed once, should a listing show one twice
        // (a directory mounted on its own subdirectory, or a subvolume
        // whose entry's number is the root's).
        let mut listed = FxHashSet::from_iter([self.root]);
        while let Some(dir) = queue.pop_front() {
            let Ok(entries) = list(dir) else { continue };
            for e in entries {
                self.remember(dir, &e.name, e.id);
                if e.id == id {
                    return Ok(Place {
                        parent: dir,
                        name: e.name.into(),
                    });
                }
                if e.is_dir && listed.insert(e.id) {
                    queue.push_back(e.id);
                }
            }
        }
        self.forget(id);
        Err(Error::Stale)
    }

    /// Walks made so far to find an id.
    pub fn walks(&self) -> u64 {
        self.walks.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(name: &str, id: FileId, is_dir: bool) -> Seen {
        Seen {
            name: name.as_bytes().into(),
            id,
            is_dir,
        }
    }

    /// root(1) / a(2, dir) / b(3); root / c(4)
    fn tree(dir: FileId) -> Result<Vec<Seen>> {
        Ok(match dir {
            1 => vec![seen("a", 2, true), seen("c", 4, false)],
            2 => vec![seen("b", 3, false)],
            _ => Vec::new(),
        })
    }

    #[test]
    fn an_unknown_id_is_found_by_one_walk_then_kept() {
        let ids = IdTable::new(1);
        let place = ids.place(3, tree).unwrap();
        assert_eq!((place.parent, &*place.name), (2, &b"b"[..]));
        assert_eq!(ids.place(3, tree).unwrap(), place);
        assert_eq!(ids.walks(), 1);
        // A miss is remembered: the next ask does not walk.
        assert_eq!(ids.place(9, tree), Err(Error::Stale));
        assert_eq!(ids.place(9, tree), Err(Error::Stale));
        assert_eq!(ids.walks(), 2);
    }

    #[test]
    fn a_walk_lists_each_directory_once_when_a_listing_shows_the_root_again() {
        let ids = IdTable::new(1);
        let mut listings = 0;
        // root / a(2, dir) / up(1: the root, as a mount on its own
        // subdirectory shows it), with the id sought nowhere.
        let looped = |dir| {
            listings += 1;
            assert!(listings <= 2, "listed {listings} times");
            Ok(match dir {
                1 => vec![seen("a", 2, true)],
                2 => vec![seen("up", 1, true), seen("a", 2, true)],
                _ => Vec::new(),
            })
        };
        assert_eq!(ids.place(9, looped), Err(Error::Stale));
    }

    #[test]
    fn a_file_with_names_left_is_not_gone() {
        let ids = IdTable::new(1);
        ids.remember(1, b"x", 7);
        ids.unlinked(1, b"x", 7, 1);
        assert!(!ids.is_gone(7));
        assert_eq!(ids.get(7), None);
        ids.remember(1, b"y", 7);
        // Removing a name other than the one kept keeps the place.
        ids.unlinked(1, b"x", 7, 1);
        assert_eq!(ids.get(7).unwrap().name.as_ref(), b"y");
        ids.unlinked(1, b"y", 7, 0);
        assert!(ids.is_gone(7));
        assert_eq!(ids.place(7, tree), Err(Error::Stale));
        assert_eq!(ids.walks(), 0);
        // Seen again (a new file reusing the id): no longer gone.
        ids.remember(1, b"z", 7);
        assert!(!ids.is_gone(7));
    }
}
