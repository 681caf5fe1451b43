//! A limit on what a workspace's upper may hold: its files' bytes (their
//! sizes) plus a fixed charge per entry. A change that would pass it (a
//! write or truncate that grows a file, a copy-up, a new entry) fails with
//! NOSPC before it starts, so a copy-up never half happens; reads,
//! removals and changes within the limit go on.
//!
//! Growth is added as changes are made. What frees room (a removal, a
//! truncate, a failed change) only marks the count stale: the upper is
//! counted again, once, when a change would not fit, so a program that
//! removes files and writes again finds the room, and one that keeps
//! hitting the limit costs no walk.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};

use layerfs_vfs::hostdir::{self, cstr};
use layerfs_vfs::{Error, Result};
use rustc_hash::FxHashSet;

use super::merge::{Layers, UPPER};
use super::whiteouts::is_hidden;
use super::StackFs;

/// What each entry of the upper is charged besides its bytes: a block.
pub const ENTRY_CHARGE: u64 = 4096;

/// No limit.
const NONE: u64 = u64::MAX;

pub(super) struct Quota {
    limit: AtomicU64,
    used: AtomicU64,
    stale: AtomicBool,
}

impl Default for Quota {
    fn default() -> Quota {
        Quota {
            limit: AtomicU64::new(NONE),
            used: AtomicU64::new(0),
            stale: AtomicBool::new(false),
        }
    }
}

impl Quota {
    fn limited(&self) -> bool {
        self.limit.load(Relaxed) != NONE
    }

    /// Adds `bytes` if they fit under the limit.
    fn try_add(&self, bytes: u64) -> bool {
        let limit = self.limit.load(Relaxed);
        self.used
            .fetch_update(SeqCst, SeqCst, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            })
            .is_ok()
    }
}

impl StackFs {
    /// Limits what the upper may hold to `limit` bytes (sizes and
    /// [`ENTRY_CHARGE`] per entry), or lifts the limit. What it holds is
    /// counted now; it may already be past a new limit, and then only
    /// changes that free room go on.
    pub fn set_size_limit(&self, limit: Option<u64>) -> Result<()> {
        let layers = self.tree.current();
        let used = held(&layers)?;
        self.upper.quota.used.store(used, SeqCst);
        self.upper.quota.stale.store(false, SeqCst);
        self.upper.quota.limit.store(limit.unwrap_or(NONE), SeqCst);
        Ok(())
    }

    /// The limit, if one is set, and what the upper holds (counted now).
    pub fn size_used(&self) -> Result<(u64, Option<u64>)> {
        let limit = self.upper.quota.limit.load(SeqCst);
        Ok((
            held(&self.tree.current())?,
            (limit != NONE).then_some(limit),
        ))
    }
}

impl Quota {
    /// Whether writes must reach this filesystem to be counted: a door
    /// may not hand out host files for writing then (FUSE passthrough).
    pub(super) fn counts_writes(&self) -> bool {
        self.limited()
    }

    /// Takes `bytes` of room for a change about to be made, or fails with
    /// NOSPC when they do not fit even once the upper is counted again.
    pub(super) fn reserve(&self, layers: &Layers, bytes: u64) -> Result<()> {
        if !self.limited() || self.try_add(bytes) {
            return Ok(());
        }
        if self.stale.swap(false, SeqCst) {
            self.used.store(held(layers)?, SeqCst);
            if self.try_add(bytes) {
                return Ok(());
            }
        }
        Err(Error::NoSpc)
    }

    /// Room may have been freed (a removal, a truncate, a change that
    /// failed after taking room): counted again when next needed.
    pub(super) fn freed(&self) {
        if self.limited() {
            self.stale.store(true, SeqCst);
        }
    }
}

/// What the upper of `layers` holds: each file's size once (hard links
/// are one file), and [`ENTRY_CHARGE`] per entry; whiteouts, markers and
/// the state directory are not charged.
fn held(layers: &Layers) -> Result<u64> {
    let mut seen = FxHashSet::default();
    let root = layers.all[UPPER].root.clone();
    held_in(root.as_fd(), &mut seen)
}

fn held_in(dir: BorrowedFd<'_>, seen: &mut FxHashSet<u64>) -> Result<u64> {
    let mut total = 0;
    for (name, ino, is_dir) in hostdir::list(dir)? {
        if is_hidden(&name) || !seen.insert(ino) {
            continue;
        }
        let c = cstr(&name)?;
        total += ENTRY_CHARGE;
        if is_dir {
            let sub = hostdir::open_dir(dir, &c)?;
            total += held_in(sub.as_fd(), seen)?;
        } else {
            match rustix::fs::statat(dir, &*c, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => total += st.st_size as u64,
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(total)
}
