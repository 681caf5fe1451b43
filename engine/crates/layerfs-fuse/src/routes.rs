//! How many requests reached a mount's door through each route, told when
//! the mount is taken down: what shows that a mount served on the rings
//! was not served through `/dev/fuse` after all.

use std::sync::atomic::{AtomicU64, Ordering};

/// Shared by the door of `/dev/fuse` and those of the rings.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    device: AtomicU64,
    rings: AtomicU64,
}

impl Routes {
    pub(crate) fn through_device(&self) {
        self.device.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn through_rings(&self) {
        self.rings.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests answered so far through `/dev/fuse` (besides FORGETs and
    /// INTERRUPTs, which never come through the rings) and through them.
    pub(crate) fn counted(&self) -> (u64, u64) {
        (
            self.device.load(Ordering::Relaxed),
            self.rings.load(Ordering::Relaxed),
        )
    }
}
