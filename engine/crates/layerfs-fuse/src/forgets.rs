//! FORGETs read in batches once FUSE over io_uring serves the mount.
//!
//! With the rings serving, the kernel still sends FORGETs (and INTERRUPTs)
//! through `/dev/fuse`, and each FORGET it queues wakes a door thread asleep
//! there: `rm -rf` sends one per file, as it goes. The door keeps no lookup
//! counts, so a FORGET changes nothing in the door and may wait. A thread
//! woken by one therefore waits [`PAUSE`] before it reads on: FORGETs
//! queued meanwhile wake no one and come in one BATCH_FORGET. `rm -rf` of
//! 20,000 files through the rings took 0.46-0.50 s with it, against
//! 0.84-0.89 s without (docs/architecture/engine/kernel-routes/fuse.md).
//!
//! Through `/dev/fuse` alone the same wait would hold up the requests that
//! thread would read next, so there the door never waits.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a door thread woken by a FORGET waits before it reads on.
const PAUSE: Duration = Duration::from_millis(5);

/// The FORGETs of one BATCH_FORGET reach the door one after another within
/// microseconds; one that comes longer than this after the thread's last
/// found the thread asleep, and woke it.
const WOKEN_AFTER: Duration = Duration::from_micros(50);

thread_local! {
    /// When this thread last handled a FORGET.
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Whether the rings serve the mount, shared by the door of `/dev/fuse`
/// and those of the rings.
#[derive(Default)]
pub(crate) struct Forgets {
    rings_serve: AtomicBool,
}

impl Forgets {
    /// Said by a ring at its first request: the kernel sends requests to
    /// the rings only once every CPU's has registered, and from then on
    /// nothing but FORGETs and INTERRUPTs through `/dev/fuse`.
    pub(crate) fn rings_serve(&self) {
        self.rings_serve.store(true, Ordering::Relaxed);
    }

    /// A FORGET was handled on this thread: waits, if it woke the thread
    /// while the rings serve, and says whether it did.
    pub(crate) fn handled(&self) -> bool {
        let now = Instant::now();
        let wait = self.wait(LAST.get(), now);
        if let Some(wait) = wait {
            std::thread::sleep(wait);
        }
        LAST.set(Some(if wait.is_some() { Instant::now() } else { now }));
        wait.is_some()
    }

    /// How long to wait after a FORGET handled at `now`, the thread's last
    /// having been handled at `last`.
    fn wait(&self, last: Option<Instant>, now: Instant) -> Option<Duration> {
        let woken = last.is_none_or(|last| now.saturating_duration_since(last) > WOKEN_AFTER);
        (woken && self.rings_serve.load(Ordering::Relaxed)).then_some(PAUSE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn through_dev_fuse_alone_no_forget_waits() {
        let forgets = Forgets::default();
        let now = Instant::now();
        assert_eq!(forgets.wait(None, now), None);
        assert_eq!(forgets.wait(Some(now), now + Duration::from_secs(1)), None);
    }

    #[test]
    fn with_the_rings_only_a_forget_that_woke_the_thread_waits() {
        let forgets = Forgets::default();
        forgets.rings_serve();
        let now = Instant::now();
        assert_eq!(forgets.wait(None, now), Some(PAUSE), "the thread's first");
        let batch = now + Duration::from_micros(1);
        assert_eq!(forgets.wait(Some(now), batch), None, "the next of a batch");
        let later = batch + Duration::from_millis(1);
        assert_eq!(
            forgets.wait(Some(batch), later),
            Some(PAUSE),
            "one that woke it"
        );
    }

    #[test]
    fn a_thread_waits_when_a_forget_wakes_it() {
        let forgets = Forgets::default();
        // Each test has a thread of its own: this is its first FORGET.
        assert!(!forgets.handled(), "waited with no ring serving");
        forgets.rings_serve();
        LAST.set(None);
        let started = Instant::now();
        assert!(forgets.handled(), "the first FORGET did not wait");
        assert!(started.elapsed() >= PAUSE);
    }
}
