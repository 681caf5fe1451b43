//! Directory listings in cookie order, cached per directory, with the
//! attributes of the files listed.
//!
//! A cookie is a hash of the entry's name, so a listing resumes at the same
//! place whatever was added or removed in between. Listing a directory means
//! reading all of it and sorting it by cookie; the sorted listing is kept
//! while the directory's mtime and ctime stay the same (every change to its
//! entries moves them), so paging through a large directory reads it once.
//!
//! File times come from a coarse clock: two changes in one tick leave the
//! same times. So a listing is only kept once its directory has not changed
//! for [`SETTLED`]; any later change then carries a later time.
//!
//! The attributes of a kept listing's files are kept too, so that listing a
//! directory again with attributes (READDIRPLUS) reads none of them from the
//! host. The directory is watched ([`Watcher`]) before any is read, and
//! every queued notice is taken before any is used: a change to a file made
//! through this directory, by layerfs or anyone else, drops its attributes
//! before the next listing. What the watch cannot see (see
//! [`crate::hostdir::watch`]) is bounded: directories and files with more
//! than one name are never kept, and nothing is served from here once it is
//! [`KEPT_FOR`] old.

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::attr::{Attr, FileKind, Timestamp};
use crate::bounded::BoundedMap;
use crate::error::Result;
use crate::fs::{DirEntry, READS_AT_HAND};
use crate::hostdir::name_cookie;
use crate::hostdir::watch::{Notice, WatchId, Watcher};
use crate::ids::Seen;
use crate::FileId;

/// Directories whose listing is kept; past this the cache starts over.
const CACHED_DIRS: usize = 256;
/// How long a directory must be unchanged before its listing is kept: well
/// past the coarsest clock tick (10 ms at HZ=100).
const SETTLED: Duration = Duration::from_millis(50);
/// Listed files whose attributes are kept (about 150 bytes each), in all
/// directories; past this they start over.
const KEPT_ATTRS: usize = 65_536;
/// The oldest kept attributes served: how late a change no notice reports
/// (a write through a mapping, a change under an overlay) can show in a
/// listing. The NFS client itself keeps attributes for 3 s or more.
pub const KEPT_FOR: Duration = Duration::from_secs(1);

/// One entry other than `.` and `..`.
pub struct Listed {
    pub cookie: u64,
    pub fileid: FileId,
    pub name: Box<[u8]>,
}

/// A directory's listing and the mtime and ctime it was read at.
struct Kept {
    mtime: Timestamp,
    ctime: Timestamp,
    listing: Arc<Vec<Listed>>,
    /// The directory's watch, once its files' attributes are kept.
    watch: Option<WatchId>,
    /// Attributes by position in `listing`, with when they were read.
    attrs: FxHashMap<u32, (Attr, Instant)>,
}

struct Cache {
    dirs: BoundedMap<FileId, Kept>,
    /// Attributes kept in all directories.
    attrs: usize,
    /// Moves whenever notices are taken: attributes read before a move may
    /// have been changed by what it reported, and are not kept.
    notices_taken: u64,
}

impl Default for Cache {
    fn default() -> Self {
        Cache {
            dirs: BoundedMap::new(CACHED_DIRS),
            attrs: 0,
            notices_taken: 0,
        }
    }
}

pub struct Listings {
    cache: Mutex<Cache>,
    watcher: Option<Watcher>,
}

impl Default for Listings {
    fn default() -> Self {
        Listings {
            cache: Mutex::default(),
            watcher: Watcher::new(),
        }
    }
}

impl Listings {
    /// The listing of `dir` (with attributes `attr`), sorted by cookie;
    /// `read` gives its entries when they must be read anew.
    pub fn get(
        &self,
        dir: FileId,
        attr: &Attr,
        read: impl FnOnce() -> Result<Vec<Seen>>,
    ) -> Result<Arc<Vec<Listed>>> {
        if let Some(kept) = self.cache.lock().dirs.get(&dir) {
            if (kept.mtime, kept.ctime) == (attr.mtime, attr.ctime) {
                return Ok(kept.listing.clone());
            }
        }
        let mut entries: Vec<Listed> = read()?
            .into_iter()
            .map(|e| Listed {
                cookie: name_cookie(&e.name),
                fileid: e.id,
                name: e.name,
            })
            .collect();
        entries.sort_unstable_by_key(|e| e.cookie);
        let listing = Arc::new(entries);
        if !settled(attr) {
            return Ok(listing);
        }
        let mut cache = self.cache.lock();
        if let Some(dropped) = cache.dirs.make_room(&dir) {
            for old in dropped.into_values() {
                self.unwatch(old.watch);
            }
            cache.attrs = 0;
        }
        let kept = Kept {
            mtime: attr.mtime,
            ctime: attr.ctime,
            listing: listing.clone(),
            watch: None,
            attrs: FxHashMap::default(),
        };
        if let Some(old) = cache.dirs.insert(dir, kept) {
            // Watched anew when its attributes are next kept: the directory
            // now at this id may not be the one that was watched.
            self.unwatch(old.watch);
            cache.attrs -= old.attrs.len();
        }
        Ok(listing)
    }

    /// Whether `dir`'s listing is kept (with its files' attributes, watched,
    /// if `with_attrs`), so that listing it again while it is unchanged
    /// reads at most [`READS_AT_HAND`] entries' attributes from the host
    /// (directories, files with several names). What a change or
    /// [`KEPT_FOR`] makes it read again was read lately: those inodes are in
    /// memory.
    pub fn at_hand(&self, dir: FileId, with_attrs: bool) -> bool {
        self.cache.lock().dirs.get(&dir).is_some_and(|kept| {
            !with_attrs
                || (kept.watch.is_some() && kept.listing.len() <= kept.attrs.len() + READS_AT_HAND)
        })
    }

    /// Fills in the attributes of `entries`, the entries of `dir` (open as
    /// `fd`) listed in `listing` from position `first` on, in order: the kept
    /// ones where they are current, `read` for the rest.
    pub fn fill_attrs(
        &self,
        dir: FileId,
        fd: BorrowedFd<'_>,
        listing: &Arc<Vec<Listed>>,
        first: usize,
        entries: &mut [DirEntry],
        read: impl Fn(&[u8]) -> Option<Attr>,
    ) {
        let now = Instant::now();
        // Read after this, or not served (one comparison per entry).
        let fresh_after = now.checked_sub(KEPT_FOR);
        let (notices_seen, keeping) = {
            let mut cache = self.cache.lock();
            self.take_notices(&mut cache);
            let keeping = match cache.dirs.get_mut(&dir) {
                Some(kept) if Arc::ptr_eq(&kept.listing, listing) => {
                    if kept.watch.is_none() {
                        kept.watch = self.watcher.as_ref().and_then(|w| w.watch(fd).ok());
                    }
                    for (at, e) in (first..).zip(entries.iter_mut()) {
                        e.attr = kept
                            .attrs
                            .get(&(at as u32))
                            .filter(|(_, read_at)| fresh_after.is_none_or(|t| *read_at > t))
                            .map(|(attr, _)| *attr);
                    }
                    kept.watch.is_some()
                }
                _ => false,
            };
            (cache.notices_taken, keeping)
        };
        let mut read_now = Vec::new();
        for (at, e) in (first..).zip(entries.iter_mut()) {
            if e.attr.is_none() {
                e.attr = read(&e.name);
                if let Some(attr) = e.attr.filter(|a| keeping && keepable(a)) {
                    read_now.push((at as u32, attr));
                }
            }
        }
        if read_now.is_empty() {
            return;
        }
        let mut cache = self.cache.lock();
        if cache.notices_taken != notices_seen {
            return;
        }
        let cache = &mut *cache;
        if cache.attrs + read_now.len() > KEPT_ATTRS {
            for kept in cache.dirs.values_mut() {
                kept.attrs.clear();
            }
            cache.attrs = 0;
        }
        let Some(kept) = cache
            .dirs
            .get_mut(&dir)
            .filter(|k| Arc::ptr_eq(&k.listing, listing))
        else {
            return;
        };
        for (at, attr) in read_now {
            if kept.attrs.insert(at, (attr, now)).is_none() {
                cache.attrs += 1;
            }
        }
    }

    /// The entry `name` of `dir` changed in a way its directory's watch
    /// does not report (it gained a name elsewhere).
    pub fn forget(&self, dir: FileId, name: &[u8]) {
        let mut cache = self.cache.lock();
        let cache = &mut *cache;
        if let Some(kept) = cache.dirs.get_mut(&dir) {
            cache.attrs -= forget_entry(kept, name);
        }
    }

    /// Applies every queued notice to what is kept.
    fn take_notices(&self, cache: &mut Cache) {
        let Some(watcher) = &self.watcher else {
            return;
        };
        let taken = watcher.drain(|notice| {
            let (dirs, attrs) = (&mut cache.dirs, &mut cache.attrs);
            match notice {
                Notice::Entry { watch, name } => {
                    for kept in dirs.values_mut().filter(|k| k.watch == Some(watch)) {
                        *attrs -= forget_entry(kept, name);
                    }
                }
                Notice::Dir { watch } | Notice::Ended { watch } => {
                    for kept in dirs.values_mut().filter(|k| k.watch == Some(watch)) {
                        *attrs -= std::mem::take(&mut kept.attrs).len();
                        if matches!(notice, Notice::Ended { .. }) {
                            kept.watch = None;
                        }
                    }
                }
                Notice::Lost => {
                    for kept in dirs.values_mut() {
                        kept.attrs.clear();
                    }
                    *attrs = 0;
                }
            }
        });
        if taken > 0 {
            cache.notices_taken += 1;
        }
    }

    fn unwatch(&self, watch: Option<WatchId>) {
        if let (Some(watcher), Some(watch)) = (&self.watcher, watch) {
            watcher.unwatch(watch);
        }
    }
}

/// Drops the kept attributes of the entry `name`; how many were dropped.
fn forget_entry(kept: &mut Kept, name: &[u8]) -> usize {
    let cookie = name_cookie(name);
    let listing = &kept.listing;
    let from = listing.partition_point(|e| e.cookie < cookie);
    let mut dropped = 0;
    for at in (from..listing.len()).take_while(|&at| listing[at].cookie == cookie) {
        if *listing[at].name == *name && kept.attrs.remove(&(at as u32)).is_some() {
            dropped += 1;
        }
    }
    dropped
}

/// Whether a change to the file with `attr` reaches its directory's watch:
/// not for a directory (whose own entries change without a notice to its
/// parent) nor for a file with another name, perhaps in another directory.
fn keepable(attr: &Attr) -> bool {
    attr.kind != FileKind::Directory && attr.nlink == 1
}

fn settled(attr: &Attr) -> bool {
    let changed = attr.mtime.max(attr.ctime);
    let changed = Duration::new(changed.secs.max(0) as u64, changed.nanos);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(changed) > SETTLED
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use crate::hostdir::{list, Stats};
    use std::cell::Cell;
    use std::os::fd::{AsFd, OwnedFd};

    const FILES: usize = 20;

    struct Dir {
        _tmp: tempfile::TempDir,
        fd: OwnedFd,
        stats: Stats,
        listings: Listings,
        listing: Arc<Vec<Listed>>,
    }

    impl Dir {
        fn new() -> Dir {
            let tmp = tempfile::tempdir().unwrap();
            std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
            for i in 0..FILES {
                std::fs::write(tmp.path().join(format!("f{i}")), b"12345").unwrap();
            }
            let fd = rustix::fs::open(
                tmp.path(),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            let stats = Stats::for_export(fd.as_fd());
            // A listing is kept once its directory has settled.
            std::thread::sleep(SETTLED + Duration::from_millis(20));
            let listings = Listings::default();
            let attr = stats.fd(fd.as_fd()).unwrap();
            let listing = listings
                .get(1, &attr, || {
                    Ok(list(fd.as_fd())?
                        .into_iter()
                        .map(|(name, id, is_dir)| Seen {
                            name: name.into(),
                            id,
                            is_dir,
                        })
                        .collect())
                })
                .unwrap();
            Dir {
                _tmp: tmp,
                fd,
                stats,
                listings,
                listing,
            }
        }

        fn path(&self, name: &str) -> std::path::PathBuf {
            self._tmp.path().join(name)
        }

        fn entries(&self) -> Vec<DirEntry> {
            self.listing
                .iter()
                .map(|l| DirEntry {
                    fileid: l.fileid,
                    name: crate::fs::Name::from_slice(&l.name),
                    cookie: l.cookie,
                    attr: None,
                })
                .collect()
        }

        /// Lists every entry with attributes; how many were read from the
        /// host. Each listed attribute must be the host's.
        fn list(&self) -> usize {
            let reads = Cell::new(0);
            let mut entries = self.entries();
            let read = |name: &[u8]| {
                reads.set(reads.get() + 1);
                self.stats.at(self.fd.as_fd(), name).ok()
            };
            self.listings
                .fill_attrs(1, self.fd.as_fd(), &self.listing, 0, &mut entries, read);
            for e in &entries {
                let host = self.stats.at(self.fd.as_fd(), &e.name[..]).unwrap();
                assert_eq!(e.attr, Some(host), "{}", String::from_utf8_lossy(&e.name));
            }
            reads.get()
        }
    }

    fn link_elsewhere(d: &Dir, name: &str) {
        std::fs::hard_link(d.path(name), d.path("elsewhere").join(name)).unwrap();
    }

    #[test]
    fn a_listing_again_reads_only_what_changed_since() {
        let d = Dir::new();
        assert_eq!(d.list(), FILES + 1, "first listing");
        assert_eq!(d.list(), 1, "again: only the directory `elsewhere`");

        std::fs::write(d.path("f3"), b"longer than it was").unwrap();
        assert_eq!(d.list(), 2, "a write outside layerfs");

        let f5 = std::fs::OpenOptions::new()
            .write(true)
            .open(d.path("f5"))
            .unwrap();
        f5.set_len(1).unwrap();
        std::fs::set_permissions(
            d.path("f6"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        f5.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(d.list(), 3, "a truncate, a chmod, a utimes");

        // A new name elsewhere is not reported here: forgetting is the
        // caller's (layerfs' LINK does it), and the file is not kept again.
        link_elsewhere(&d, "f8");
        d.listings.forget(1, b"f8");
        assert_eq!(d.list(), 2);
        std::fs::write(d.path("elsewhere/f8"), b"written through its other name").unwrap();
        assert_eq!(d.list(), 2, "a file with two names is read every time");
    }

    #[test]
    fn nothing_is_served_past_its_age() {
        let d = Dir::new();
        d.list();
        // The one change no notice reports: a name added elsewhere, then
        // a write through it.
        link_elsewhere(&d, "f1");
        std::fs::write(d.path("elsewhere/f1"), b"unseen").unwrap();
        std::thread::sleep(KEPT_FOR);
        assert_eq!(d.list(), FILES + 1, "all of it is read again");
    }

    #[test]
    fn a_change_made_while_a_listing_reads_is_never_kept() {
        let d = Dir::new();
        d.list();
        std::fs::write(d.path("f0"), b"changed").unwrap();
        // While this listing reads f0 anew, f0 changes again and another
        // listing takes that change's notice: what this one read is old.
        let changed = Cell::new(false);
        let mut entries = d.entries();
        d.listings
            .fill_attrs(1, d.fd.as_fd(), &d.listing, 0, &mut entries, |name| {
                let attr = d.stats.at(d.fd.as_fd(), name).ok();
                if name == b"f0" && !changed.replace(true) {
                    std::fs::write(d.path("f0"), b"changed again").unwrap();
                    d.list();
                }
                attr
            });
        assert!(changed.get());
        assert_eq!(
            entries
                .iter()
                .find(|e| e.name[..] == b"f0"[..])
                .unwrap()
                .attr
                .unwrap()
                .size,
            7
        );
        // Had it been kept, this would serve size 7.
        d.list();
    }

    #[test]
    fn a_directory_whose_listing_changed_keeps_nothing_of_the_old_one() {
        let d = Dir::new();
        d.list();
        std::fs::write(d.path("new"), b"").unwrap();
        // The old listing's positions mean nothing in the new one, which is
        // kept once the directory has settled.
        std::thread::sleep(SETTLED + Duration::from_millis(20));
        let attr = d.stats.fd(d.fd.as_fd()).unwrap();
        let fresh = d.listings.get(1, &attr, || Ok(Vec::new())).unwrap();
        assert!(!Arc::ptr_eq(&fresh, &d.listing));
        assert_eq!(d.list(), FILES + 1, "the old listing is no longer kept");
    }
}
