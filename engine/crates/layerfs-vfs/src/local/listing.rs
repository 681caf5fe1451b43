//! Directory listings in cookie order, cached per directory.
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

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::attr::{Attr, Timestamp};
use crate::error::Result;
use crate::hostdir::name_cookie;
use crate::ids::Seen;
use crate::FileId;

/// Directories whose listing is kept; past this the cache starts over.
const CACHED_DIRS: usize = 256;
/// How long a directory must be unchanged before its listing is kept: well
/// past the coarsest clock tick (10 ms at HZ=100).
const SETTLED: Duration = Duration::from_millis(50);

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
}

#[derive(Default)]
pub struct Listings {
    cache: Mutex<HashMap<FileId, Kept>>,
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
        if let Some(kept) = self.cache.lock().get(&dir) {
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
        if cache.len() >= CACHED_DIRS {
            cache.clear();
        }
        let kept = Kept {
            mtime: attr.mtime,
            ctime: attr.ctime,
            listing: listing.clone(),
        };
        cache.insert(dir, kept);
        Ok(listing)
    }
}

fn settled(attr: &Attr) -> bool {
    let changed = attr.mtime.max(attr.ctime);
    let changed = Duration::new(changed.secs.max(0) as u64, changed.nanos);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(changed) > SETTLED
}
