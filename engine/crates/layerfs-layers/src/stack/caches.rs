//! What [`StackFs`](super::StackFs) keeps so as not to walk the layers again,
//! and the one rule for forgetting it.
//!
//! The upper is private and the layers never change, so only this process
//! can make a kept answer wrong, and it says so by moving one of three
//! counters:
//!
//! - the layers' `generation` moves when the stack itself changes (a commit
//!   turns the upper into a layer): everything kept goes;
//! - `dirs` moves when directories gain or lose parts or move (a directory
//!   made, copied up, renamed or removed): where directories are found goes;
//! - `entries` moves when any directory's entries change, and with `dirs`:
//!   listings and where files were found go.
//!
//! Every entry carries the counters it was made under and is used only while
//! they are current. Where a lower file was found is the exception to
//! `dirs` and `entries`: nothing but a change to that file moves it (its
//! copy-up, a removal of its name, a rename over it; a directory with lower
//! parts moves only by copying up each file under it), and each such change
//! drops it ([`Caches::forget_file`]) once it has moved `entries`. So it is
//! kept for its generation, and copying one file up, or making a directory's
//! upper part, does not send the next open of another through the layers.
//! Lower layers' attributes are kept by generation alone:
//! nothing but a new generation changes a lower file (a change copies it up,
//! and from then on it is listed in the upper). Open files are kept by
//! generation and dropped one by one when their file goes. What a LOOKUP
//! found is kept by all three counters, as listings are, and only where no
//! change to the upper can alter it without moving one: a name shown by a
//! lower layer (its attributes never change), or no such name. Each map is
//! bounded; past its bound it starts over.

use parking_lot::Mutex;
use rustc_hash::FxBuildHasher;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use layerfs_vfs::bounded::BoundedMap;
use layerfs_vfs::hostdir;
use layerfs_vfs::{Attr, FileId, KeptFile, Name};

use super::merge::{Found, Listed, UPPER};

/// A directory's listing with each entry's cookie, sorted by cookie.
pub type Listing = Arc<Vec<(u64, Listed)>>;
/// Host inode number → the paths of a file with several names, in one layer.
pub type LinkIndex = HashMap<u64, Vec<Vec<Vec<u8>>>>;

/// Files whose place is kept; past this the map starts over.
const LOCATIONS: usize = 8192;
/// Lower files whose attributes are kept (about 150 bytes each); past this
/// the map starts over.
const LOWER_ATTRS: usize = 65_536;
/// Names whose LOOKUP is kept (about 200 bytes each); past this the map
/// starts over.
const LOOKED_UP: usize = 16_384;

/// The counters an entry was made under: taken before reading what it
/// keeps, so something read while the counters moved is never current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    generation: u64,
    dirs: u64,
    entries: u64,
}

/// A map of at most `cap` entries, each with the stamp it was made under.
/// Keys are ids this process gave out, not names a client chose, so a fast
/// hash that is not keyed is safe here: a listing looks up every entry.
struct Kept<K, V> {
    map: Mutex<BoundedMap<K, (Stamp, V), FxBuildHasher>>,
}

impl<K: Hash + Eq, V: Clone> Kept<K, V> {
    fn new(cap: usize) -> Self {
        Kept {
            map: Mutex::new(BoundedMap::new(cap)),
        }
    }

    fn get(&self, key: &K, valid: impl Fn(&Stamp) -> bool) -> Option<V> {
        self.get_where(key, |stamp, _| valid(stamp))
    }

    /// The value kept for `key`, if `valid` takes it with its stamp.
    fn get_where(&self, key: &K, valid: impl Fn(&Stamp, &V) -> bool) -> Option<V> {
        let map = self.map.lock();
        map.get(key)
            .filter(|(stamp, v)| valid(stamp, v))
            .map(|(_, v)| v.clone())
    }

    /// `test` of the value kept for `key`, if valid; `false` if none is.
    fn holds(&self, key: &K, valid: impl Fn(&Stamp) -> bool, test: impl Fn(&V) -> bool) -> bool {
        let map = self.map.lock();
        map.get(key)
            .is_some_and(|(stamp, v)| valid(stamp) && test(v))
    }

    /// Keeps `value`; whether the map was full and started over.
    fn insert(&self, key: K, stamp: Stamp, value: V) -> bool {
        self.insert_with(key, stamp, || value)
    }

    /// [`insert`](Self::insert) of the value `make` gives under the map's
    /// lock, so that nothing removed under it can fall between.
    fn insert_with(&self, key: K, stamp: Stamp, make: impl FnOnce() -> V) -> bool {
        let mut map = self.map.lock();
        let full = map.make_room(&key).is_some();
        map.insert(key, (stamp, make()));
        full
    }

    /// `found(i, value)` for the i-th of `keys` kept and valid, under one
    /// lock.
    fn get_each(
        &self,
        keys: impl Iterator<Item = K>,
        valid: impl Fn(&Stamp) -> bool,
        mut found: impl FnMut(usize, &V),
    ) {
        let map = self.map.lock();
        for (i, key) in keys.enumerate() {
            if let Some((_, v)) = map.get(&key).filter(|(stamp, _)| valid(stamp)) {
                found(i, v);
            }
        }
    }

    fn remove(&self, key: &K) {
        self.map.lock().remove(key);
    }

    fn clear(&self) {
        self.map.lock().clear();
    }
}

/// A file kept open. Kept until its file goes (a name of it removed, a
/// copy-up) or the generation of layers moves: the id names this file, with
/// this generation, for as long as it is kept.
#[derive(Clone)]
struct OpenFile {
    layer: usize,
    file: KeptFile,
    generation: u64,
}

/// Where a file (not a directory) was found; `lasting` for a lower file
/// found while no entry changed, which stays found there until a change to
/// it drops it.
#[derive(Clone)]
struct Located {
    found: Found,
    lasting: bool,
}

pub struct Caches {
    dirs_moved: AtomicU64,
    entries_moved: AtomicU64,
    /// Where directories are, with every layer's part of each.
    dirs: Kept<FileId, Found>,
    /// Where files (not directories) were found.
    located: Kept<FileId, Located>,
    listings: Kept<FileId, Listing>,
    /// Entries whose attributes a directory's last listing with attributes
    /// read from the host, kept as its listing is.
    listed_reads: Kept<FileId, usize>,
    /// Open files: the layer each was opened in, its descriptor, and the
    /// generation clients see it with.
    files: Kept<FileId, OpenFile>,
    /// Per layer tag, read once: lower layers never change.
    links: Mutex<HashMap<u16, Arc<LinkIndex>>>,
    /// Attributes of files listed in a lower layer, so that listing a
    /// directory of an image again reads none of them from the host.
    lower_attrs: Kept<FileId, Attr>,
    /// By directory and name cookie: the name, and the attributes it shows
    /// from a lower layer or `None` for no such name.
    looked_up: Kept<(FileId, u64), (Name, Option<Attr>)>,
}

impl Caches {
    /// Caches for a stack of `layers` layers (the upper included). They
    /// hold descriptors, so their sizes come from the process's limit on
    /// open files (raised to its hard limit here): a quarter of it each for
    /// directories' parts (with every layer's descriptor), listings (which
    /// hold their directory's) and files, the last quarter left to calls in
    /// flight.
    pub fn for_layers(layers: usize) -> Caches {
        let limit = hostdir::raise_fd_limit() as usize;
        let dirs = (limit / 4 / (layers + 1)).max(8);
        Self::new(dirs, (limit / 4).max(8))
    }

    /// Caches that hold at most `dirs` directories (and as many listings)
    /// and `files` open files.
    fn new(dirs: usize, files: usize) -> Caches {
        Caches {
            dirs_moved: AtomicU64::new(0),
            entries_moved: AtomicU64::new(0),
            dirs: Kept::new(dirs),
            located: Kept::new(LOCATIONS),
            listings: Kept::new(dirs),
            listed_reads: Kept::new(dirs),
            files: Kept::new(files),
            links: Mutex::new(HashMap::new()),
            lower_attrs: Kept::new(LOWER_ATTRS),
            looked_up: Kept::new(LOOKED_UP),
        }
    }

    pub fn stamp(&self, generation: u64) -> Stamp {
        Stamp {
            generation,
            dirs: self.dirs_moved.load(Relaxed),
            entries: self.entries_moved.load(Relaxed),
        }
    }

    /// Some directory's entries changed.
    pub fn entries_changed(&self) {
        self.entries_moved.fetch_add(1, Relaxed);
    }

    /// Directories gained or lost parts, or moved; their entries changed too.
    pub fn dirs_changed(&self) {
        self.dirs_moved.fetch_add(1, Relaxed);
        self.entries_changed();
    }

    /// The stack changed (a new generation of layers): nothing kept holds.
    /// Entries are stamped with the generation; this drops their descriptors.
    pub fn layers_changed(&self) {
        self.dirs.clear();
        self.located.clear();
        self.listings.clear();
        self.files.clear();
        self.lower_attrs.clear();
        self.looked_up.clear();
        self.dirs_changed();
    }

    /// Whether a directory kept under `s` is current: directories move
    /// only with `dirs` and the generation.
    fn dir_is_current(&self, generation: u64) -> impl Fn(&Stamp) -> bool {
        let now = self.stamp(generation);
        move |s| s.generation == now.generation && s.dirs == now.dirs
    }

    pub fn dir(&self, id: FileId, generation: u64) -> Option<Found> {
        self.dirs.get(&id, self.dir_is_current(generation))
    }

    /// Whether directory `id` is kept, current, and passes `test`; read
    /// in place, not copied. `test` runs under the map's lock, so it takes
    /// none of these maps'.
    pub fn dir_holds(&self, id: FileId, generation: u64, test: impl Fn(&Found) -> bool) -> bool {
        self.dirs.holds(&id, self.dir_is_current(generation), test)
    }

    pub fn keep_dir(&self, id: FileId, stamp: Stamp, found: Found) {
        if self.dirs.insert(id, stamp, found) {
            // Kept files hold their directories' descriptors: let them go too.
            self.located.clear();
        }
    }

    pub fn located(&self, id: FileId, generation: u64) -> Option<Found> {
        let now = self.stamp(generation);
        let current =
            |s: &Stamp, l: &Located| *s == now || (l.lasting && s.generation == now.generation);
        self.located.get_where(&id, current).map(|l| l.found)
    }

    /// Keeps where `id` was found by a walk that began under `stamp`. A
    /// lower file is kept past other changes when no entry changed during
    /// the walk: then it saw every change that had moved `id`, and a change
    /// to `id` still under way drops it after this (both under the map's
    /// lock, the drop after the change moved `entries`).
    pub fn keep_located(&self, id: FileId, stamp: Stamp, found: Found) {
        self.located.insert_with(id, stamp, || Located {
            lasting: found.layer != UPPER && self.entries_moved.load(Relaxed) == stamp.entries,
            found,
        });
    }

    pub fn listing(&self, dir: FileId, generation: u64) -> Option<Listing> {
        let now = self.stamp(generation);
        self.listings.get(&dir, |s| *s == now)
    }

    pub fn keep_listing(&self, dir: FileId, stamp: Stamp, listing: Listing) {
        self.listings.insert(dir, stamp, listing);
    }

    /// How many entries' attributes the last listing of `dir` with
    /// attributes read from the host, if its listing is still current.
    pub fn listed_reads(&self, dir: FileId, generation: u64) -> Option<usize> {
        let now = self.stamp(generation);
        self.listed_reads.get(&dir, |s| *s == now)
    }

    pub fn keep_listed_reads(&self, dir: FileId, stamp: Stamp, reads: usize) {
        self.listed_reads.insert(dir, stamp, reads);
    }

    pub fn file(&self, id: FileId, generation: u64) -> Option<(usize, KeptFile)> {
        self.files
            .get(&id, |s| s.generation == generation)
            .map(|f| (f.layer, f.file))
    }

    /// Keeps `file`, `id` open in `layer`, which clients see with
    /// `file_generation`.
    pub fn keep_file(
        &self,
        id: FileId,
        stamp: Stamp,
        layer: usize,
        file: KeptFile,
        file_generation: u64,
    ) {
        let file = OpenFile {
            layer,
            file,
            generation: file_generation,
        };
        self.files.insert(id, stamp, file);
    }

    /// Whether `id` is a file kept open in `generation` of the layers that
    /// clients see with `file_generation`.
    pub fn file_is(&self, id: FileId, generation: u64, file_generation: u64) -> bool {
        self.files.holds(
            &id,
            |s| s.generation == generation,
            |f| f.generation == file_generation,
        )
    }

    /// Whether `id` is known, from what is kept, to lie wholly in the upper
    /// in `generation`: a file found or opened there, or a directory with no
    /// lower part. A file never leaves the upper but by going, and nothing
    /// is copied up for a file already there or for an entry of such a
    /// directory.
    pub fn wholly_upper(&self, id: FileId, generation: u64) -> bool {
        let this_generation = |s: &Stamp| s.generation == generation;
        self.files.holds(&id, this_generation, |f| f.layer == UPPER)
            || self
                .located
                .holds(&id, this_generation, |l| l.found.layer == UPPER)
            || self.dir_holds(id, generation, |d| {
                d.parts.iter().all(|part| part.layer == UPPER)
            })
    }

    /// The file `id` names is gone, or moved (copied up, a name of it
    /// removed or renamed over): what is kept of it goes. Called after the
    /// change moved `entries`.
    pub fn forget_file(&self, id: FileId) {
        self.files.remove(&id);
        self.located.remove(&id);
    }

    /// The attributes of `id`, a file found in a lower layer.
    pub fn lower_attr(&self, id: FileId, generation: u64) -> Option<Attr> {
        self.lower_attrs.get(&id, |s| s.generation == generation)
    }

    /// The kept attributes of each of `ids`, lower files listed together:
    /// `found(i, attr)` for the i-th that is kept.
    pub fn lower_attrs(
        &self,
        ids: impl Iterator<Item = FileId>,
        generation: u64,
        mut found: impl FnMut(usize, Attr),
    ) {
        self.lower_attrs.get_each(
            ids,
            |s| s.generation == generation,
            |i, attr| found(i, *attr),
        );
    }

    pub fn keep_lower_attr(&self, id: FileId, stamp: Stamp, attr: Attr) {
        self.lower_attrs.insert(id, stamp, attr);
    }

    /// `id` was copied up: it is no longer a lower file.
    pub fn copied_up(&self, id: FileId) {
        self.lower_attrs.remove(&id);
    }

    /// What a LOOKUP of `name` in `dir` found, if kept and current:
    /// `Some(None)` for no such name.
    pub fn looked_up(&self, dir: FileId, name: &[u8], generation: u64) -> Option<Option<Attr>> {
        let now = self.stamp(generation);
        let map = self.looked_up.map.lock();
        map.get(&(dir, hostdir::name_cookie(name)))
            .filter(|(stamp, (kept, _))| *stamp == now && kept[..] == *name)
            .map(|(_, (_, attr))| *attr)
    }

    /// Keeps what a LOOKUP of `name` in `dir` found under `stamp`: the
    /// attributes of a name shown by a lower layer, or `None` for none.
    pub fn keep_looked_up(&self, dir: FileId, name: &[u8], stamp: Stamp, attr: Option<Attr>) {
        let key = (dir, hostdir::name_cookie(name));
        self.looked_up
            .insert(key, stamp, (Name::from_slice(name), attr));
    }

    /// The link index of layer `tag`, read by `read` the first time.
    pub fn links<E>(
        &self,
        tag: u16,
        read: impl FnOnce() -> Result<LinkIndex, E>,
    ) -> Result<Arc<LinkIndex>, E> {
        if let Some(index) = self.links.lock().get(&tag) {
            return Ok(index.clone());
        }
        let index = Arc::new(read()?);
        self.links.lock().insert(tag, index.clone());
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_map_starts_over_when_full_and_says_so() {
        let kept = Kept::new(2);
        let s = Stamp {
            generation: 0,
            dirs: 0,
            entries: 0,
        };
        assert!(!kept.insert(1, s, "a"));
        assert!(!kept.insert(2, s, "b"));
        assert!(!kept.insert(2, s, "b again"), "a key already kept fits");
        assert!(kept.insert(3, s, "c"));
        assert_eq!(kept.get(&1, |_| true), None);
        assert_eq!(kept.get(&3, |_| true), Some("c"));
    }

    #[test]
    fn each_counter_forgets_what_it_can_make_wrong() {
        let c = Caches::new(8, 8);
        let listing: Listing = Arc::new(Vec::new());
        let stamp = c.stamp(0);
        c.keep_listing(1, stamp, listing.clone());
        assert!(c.listing(1, 0).is_some());
        assert!(c.listing(1, 1).is_none(), "another generation");
        c.entries_changed();
        assert!(c.listing(1, 0).is_none(), "entries changed");

        // A listing read while entries changed is stale at once.
        let stamp = c.stamp(0);
        c.entries_changed();
        c.keep_listing(1, stamp, listing);
        assert!(c.listing(1, 0).is_none());
    }
}
