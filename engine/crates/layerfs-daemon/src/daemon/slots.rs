//! One lock per workspace: requests on different workspaces run side by
//! side, requests on one workspace run in turn.
//!
//! A slot holds the workspace's open stack (and its FUSE mount) while it
//! is open. The map of slots is locked only to find or drop a slot, never
//! while a slot is waited for; a slot no one holds and that holds nothing
//! open leaves the map when its holder lets go, so the map is as large as
//! the open workspaces and the requests in flight.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use parking_lot::{ArcMutexGuard, Mutex, RawMutex};

use super::Open;

type Slot = Arc<Mutex<Option<Open>>>;

#[derive(Default)]
pub(super) struct Slots {
    map: Mutex<HashMap<String, Slot>>,
}

/// A workspace's slot, locked: its open stack when it is open.
pub(super) struct Held<'a> {
    slots: &'a Slots,
    name: String,
    guard: Option<ArcMutexGuard<RawMutex, Option<Open>>>,
}

impl Slots {
    /// Waits for workspace `name`'s slot.
    pub(super) fn hold(&self, name: &str) -> Held<'_> {
        let slot = self.slot(name);
        self.held(name, slot.lock_arc())
    }

    /// Workspace `name`'s slot if no request holds it now.
    pub(super) fn try_hold(&self, name: &str) -> Option<Held<'_>> {
        let slot = self.slot(name);
        let guard = slot.try_lock_arc()?;
        Some(self.held(name, guard))
    }

    /// The names of the open workspaces (and of those requests hold).
    /// Looked through for FUSE mounts lost, which only Linux has.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(super) fn names(&self) -> Vec<String> {
        self.map.lock().keys().cloned().collect()
    }

    fn slot(&self, name: &str) -> Slot {
        self.map.lock().entry(name.to_owned()).or_default().clone()
    }

    fn held(&self, name: &str, guard: ArcMutexGuard<RawMutex, Option<Open>>) -> Held<'_> {
        Held {
            slots: self,
            name: name.to_owned(),
            guard: Some(guard),
        }
    }
}

impl Deref for Held<'_> {
    type Target = Option<Open>;
    fn deref(&self) -> &Option<Open> {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Option<Open> {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let open = guard.is_some();
        let slot = ArcMutexGuard::mutex(&guard).clone();
        drop(guard);
        if open {
            return;
        }
        // Under the map's lock no one else can take a new reference: the
        // map's and this one are all there are, or someone waits for it.
        let mut map = self.slots.map.lock();
        if Arc::strong_count(&slot) == 2 && slot.try_lock().is_some_and(|s| s.is_none()) {
            map.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_of_workspaces_not_open_leave_the_map() {
        let slots = Slots::default();
        {
            let _a = slots.hold("a");
            let _b = slots.hold("b");
            assert_eq!(slots.names().len(), 2);
            // Another workspace's slot is free while these are held.
            assert!(slots.try_hold("c").is_some());
            // The same workspace's is not.
            assert!(slots.try_hold("a").is_none());
        }
        assert!(slots.names().is_empty());
    }

    #[test]
    fn a_waiting_holder_keeps_the_slot() {
        let slots = Arc::new(Slots::default());
        let first = slots.hold("a");
        let waiter = {
            let slots = slots.clone();
            std::thread::spawn(move || {
                let held = slots.hold("a");
                held.is_none()
            })
        };
        // The waiter has its reference once the count rises.
        while Arc::strong_count(&slots.map.lock()["a"]) < 3 {
            std::thread::yield_now();
        }
        drop(first);
        assert!(waiter.join().unwrap());
        assert!(slots.names().is_empty());
    }
}
