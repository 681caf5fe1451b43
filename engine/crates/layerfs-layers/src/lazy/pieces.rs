//! Where each piece of a lazy layer is, and which written pieces wait to be
//! noted.
//!
//! A piece goes one way, `Missing` → `Written` → `Noted`, and back to
//! `Missing` only if the sync meant to make it durable fails:
//! - `Written`: checked and in its file. Reads are served from it, but it
//!   may not be durable yet, so it is not in the log: a kill or a crash
//!   fetches it again.
//! - `Noted`: synced, and its record appended to `filled`.
//!
//! Written pieces are noted together, after one sync of them all: once
//! [`NOTE_BYTES`] of the blob wait, by whoever wrote the last; once the
//! first has waited [`NOTE_AFTER`], by a completion or by whoever notes now
//! and then (the daemon, each second); when a completion ends; and when the
//! store is let go of. Neither a read nor a batch waits for a sync of its
//! own, and what a kill fetches again is bounded by what waits.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Written pieces are noted once this many bytes of the blob wait.
pub const NOTE_BYTES: u64 = 32 << 20;

/// Written pieces are noted once the first of them has waited this long.
pub const NOTE_AFTER: Duration = Duration::from_secs(1);

const MISSING: u8 = 0;
const WRITTEN: u8 = 1;
const NOTED: u8 = 2;

/// The state of every piece of a layer, by number.
pub(super) struct Pieces {
    states: Vec<AtomicU8>,
    /// Pieces not `Noted`.
    not_noted: AtomicUsize,
    unnoted: Mutex<Unnoted>,
}

/// Pieces written and not noted yet, in the order written.
#[derive(Default)]
struct Unnoted {
    numbers: Vec<u32>,
    /// Bytes of the blob they came from: what a kill would fetch again.
    blob_bytes: u64,
    since: Option<Instant>,
}

impl Pieces {
    /// `count` pieces, those of `noted` in the log already.
    pub(super) fn new(count: usize, noted: impl IntoIterator<Item = u32>) -> Pieces {
        let states: Vec<AtomicU8> = (0..count).map(|_| AtomicU8::new(MISSING)).collect();
        for n in noted {
            if let Some(state) = states.get(n as usize) {
                state.store(NOTED, Ordering::Relaxed);
            }
        }
        let not_noted = states
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) != NOTED)
            .count();
        Pieces {
            states,
            not_noted: AtomicUsize::new(not_noted),
            unnoted: Mutex::default(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether piece `n` has still to be fetched.
    pub(super) fn is_missing(&self, n: u32) -> bool {
        self.states[n as usize].load(Ordering::Acquire) == MISSING
    }

    pub(super) fn is_noted(&self, n: u32) -> bool {
        self.states[n as usize].load(Ordering::Acquire) == NOTED
    }

    /// Whether every piece is noted.
    pub(super) fn all_noted(&self) -> bool {
        self.not_noted.load(Ordering::Acquire) == 0
    }

    /// Piece `n`, of `blob_bytes` bytes of the blob, is in its file now.
    /// False if it was already (another writer got there first).
    pub(super) fn written(&self, n: u32, blob_bytes: u64) -> bool {
        let mut unnoted = self.unnoted.lock();
        let changed = self.states[n as usize]
            .compare_exchange(MISSING, WRITTEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if changed {
            unnoted.numbers.push(n);
            unnoted.blob_bytes += blob_bytes;
            unnoted.since.get_or_insert_with(Instant::now);
        }
        changed
    }

    /// Whether the written pieces are due to be noted: [`NOTE_BYTES`] of
    /// the blob wait, or (`by_time` too) the first has waited [`NOTE_AFTER`].
    pub(super) fn note_due(&self, by_time: bool) -> bool {
        let unnoted = self.unnoted.lock();
        unnoted.blob_bytes >= NOTE_BYTES
            || (by_time && unnoted.since.is_some_and(|t| t.elapsed() >= NOTE_AFTER))
    }

    /// The written pieces not noted yet, which the caller is to make
    /// durable and then hand to [`Pieces::noted`] or [`Pieces::lost`].
    pub(super) fn take_unnoted(&self) -> Vec<u32> {
        std::mem::take(&mut *self.unnoted.lock()).numbers
    }

    /// Written pieces `numbers` are durable and in the log.
    pub(super) fn noted(&self, numbers: &[u32]) {
        for &n in numbers {
            if self.states[n as usize]
                .compare_exchange(WRITTEN, NOTED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.not_noted.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Written pieces `numbers` could not be made durable: fetched again.
    pub(super) fn lost(&self, numbers: &[u32]) {
        for &n in numbers {
            let _ = self.states[n as usize].compare_exchange(
                WRITTEN,
                MISSING,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_goes_missing_written_noted_and_back_only_when_lost() {
        let pieces = Pieces::new(4, [3]);
        assert!(pieces.is_missing(0) && pieces.is_noted(3) && !pieces.all_noted());
        assert!(pieces.written(0, 10));
        assert!(!pieces.written(0, 10), "written twice");
        assert!(!pieces.written(3, 10), "a noted piece written again");
        assert!(pieces.written(1, 10) && pieces.written(2, 10));
        assert_eq!(pieces.take_unnoted(), [0, 1, 2]);
        assert!(pieces.take_unnoted().is_empty());
        pieces.noted(&[0, 1]);
        pieces.lost(&[2]);
        assert!(pieces.is_noted(0) && pieces.is_noted(1) && pieces.is_missing(2));
        pieces.lost(&[0]);
        assert!(pieces.is_noted(0), "a noted piece is never lost");
        assert!(!pieces.all_noted());
        assert!(pieces.written(2, 1));
        pieces.noted(&pieces.take_unnoted());
        assert!(pieces.all_noted());
    }

    #[test]
    fn written_pieces_are_due_by_bytes_of_the_blob() {
        let pieces = Pieces::new(3, []);
        assert!(!pieces.note_due(true), "nothing waits");
        pieces.written(0, NOTE_BYTES - 1);
        assert!(!pieces.note_due(false));
        pieces.written(1, 1);
        assert!(pieces.note_due(false));
        pieces.take_unnoted();
        assert!(!pieces.note_due(true), "taken: nothing waits");
    }
}
