//! The descriptors [`LocalFs`](super::LocalFs) keeps open, per kind, each
//! with the generation it had when it was opened: an open descriptor holds
//! on to its inode, so that never changes, and a handle's generation is
//! checked against it with no host call.
//!
//! At most [`KEPT_OPEN`] per kind; past that the least recently used one is
//! closed, one per descriptor kept, outside the lock. So the directories a
//! workload keeps using stay open, and no call waits for a batch of closes.

use lru::LruCache;
use parking_lot::Mutex;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::FileId;

/// Open descriptors kept per kind.
pub(super) const KEPT_OPEN: usize = 512;

struct Entry {
    fd: Arc<OwnedFd>,
    generation: u64,
}

pub(super) struct KeptOpen {
    open: Mutex<LruCache<FileId, Entry>>,
}

impl Default for KeptOpen {
    fn default() -> Self {
        KeptOpen::with_room(KEPT_OPEN)
    }
}

impl KeptOpen {
    pub(super) fn with_room(room: usize) -> Self {
        let room = NonZeroUsize::new(room).unwrap_or(NonZeroUsize::MIN);
        KeptOpen {
            open: Mutex::new(LruCache::new(room)),
        }
    }

    /// The descriptor kept for `id`, marked as just used.
    pub(super) fn fd(&self, id: FileId) -> Option<Arc<OwnedFd>> {
        self.open.lock().get(&id).map(|kept| kept.fd.clone())
    }

    /// The generation `id` had when it was opened, if it is kept.
    pub(super) fn generation(&self, id: FileId) -> Option<u64> {
        self.open.lock().peek(&id).map(|kept| kept.generation)
    }

    /// Keeps `fd`, the descriptor of `id`, which had `generation` then.
    pub(super) fn keep(&self, id: FileId, fd: Arc<OwnedFd>, generation: u64) {
        let closed = self.open.lock().push(id, Entry { fd, generation });
        drop(closed);
    }

    /// Stops keeping `id`'s descriptor.
    pub(super) fn forget(&self, id: FileId) {
        let closed = self.open.lock().pop(&id);
        drop(closed);
    }

    #[cfg(test)]
    fn holds(&self, id: FileId) -> bool {
        self.open.lock().contains(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a_descriptor() -> Arc<OwnedFd> {
        let fd = rustix::fs::open(
            "/",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .expect("open /");
        Arc::new(fd)
    }

    #[test]
    fn past_its_room_the_least_recently_used_is_closed_and_the_rest_stay() {
        let kept = KeptOpen::with_room(3);
        let fd = a_descriptor();
        for id in 1..=3 {
            kept.keep(id, fd.clone(), id * 10);
        }
        // 1 is used again, so 2 is now the one used least recently.
        assert!(kept.fd(1).is_some());
        kept.keep(4, fd.clone(), 40);
        assert!(!kept.holds(2), "the least recently used goes");
        for id in [1, 3, 4] {
            assert_eq!(kept.generation(id), Some(id * 10), "{id} stays");
        }
        // Only what is kept holds a reference: 3 kept, and ours.
        assert_eq!(Arc::strong_count(&fd), 4);
    }

    #[test]
    fn a_forgotten_descriptor_is_closed_and_its_generation_unknown() {
        let kept = KeptOpen::with_room(2);
        let fd = a_descriptor();
        kept.keep(7, fd.clone(), 70);
        kept.forget(7);
        assert_eq!(kept.generation(7), None);
        assert!(kept.fd(7).is_none());
        assert_eq!(Arc::strong_count(&fd), 1);
    }

    #[test]
    fn keeping_an_id_again_replaces_its_descriptor_and_generation() {
        let kept = KeptOpen::with_room(2);
        let (old, new) = (a_descriptor(), a_descriptor());
        kept.keep(5, old.clone(), 1);
        kept.keep(5, new.clone(), 2);
        assert_eq!(kept.generation(5), Some(2));
        assert!(Arc::ptr_eq(&kept.fd(5).expect("kept"), &new));
        assert_eq!(Arc::strong_count(&old), 1, "the replaced one is closed");
    }
}
