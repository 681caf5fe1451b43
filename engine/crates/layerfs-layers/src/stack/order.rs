//! The order in which the stack's locks are taken, written once and
//! checked in debug builds.
//!
//! 1. `layers`: read for an operation; written by a commit, a diff or a
//!    reset, which change (or must see still) every part of the tree;
//! 2. the write stripe of one file (`stripes`): its data and attributes
//!    before and after a write;
//! 3. `ns`: changes of names, copy-ups;
//! 4. the cache maps and the inode tables: each held for one lookup or
//!    insert, never while another lock is taken.
//!
//! A thread takes them in that order, skipping any, and never one it holds
//! already: a second read of `layers` would wait behind a writer queued
//! after the first (parking_lot's locks are fair) and deadlock.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    Layers = 0,
    Stripe = 1,
    Ns = 2,
}

thread_local! {
    /// The levels this thread holds, one bit each.
    static HELD: Cell<u8> = const { Cell::new(0) };
}

/// A lock's guard, with its level noted as held while it lives.
pub(super) struct Ordered<G> {
    guard: G,
    level: Level,
}

impl<G> Ordered<G> {
    /// `take` locks; in debug builds, first checks that this thread holds
    /// neither this level nor a later one.
    pub(super) fn take(level: Level, take: impl FnOnce() -> G) -> Ordered<G> {
        if cfg!(debug_assertions) {
            let bit = 1u8 << level as u8;
            let held = HELD.get();
            assert!(
                held & !(bit - 1) == 0,
                "lock order: {level:?} taken while this thread holds {held:#05b} \
                 (order: layers, stripe, ns; see stack/order.rs)"
            );
            HELD.set(held | bit);
        }
        Ordered {
            guard: take(),
            level,
        }
    }
}

impl<G> Drop for Ordered<G> {
    fn drop(&mut self) {
        if cfg!(debug_assertions) {
            HELD.set(HELD.get() & !(1u8 << self.level as u8));
        }
    }
}

impl<G: Deref> Deref for Ordered<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Ordered<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_in_order_pass_and_out_of_order_fail_in_debug_builds() {
        let m = parking_lot::Mutex::new(());
        {
            let _a = Ordered::take(Level::Layers, || m.lock());
            let _b = Ordered::take(Level::Ns, || ());
        }
        // Released: taken again in any order.
        let _ns = Ordered::take(Level::Ns, || ());
        drop(_ns);
        let backwards = std::thread::spawn(|| {
            let _ns = Ordered::take(Level::Ns, || ());
            let _layers = Ordered::take(Level::Layers, || ());
        })
        .join();
        assert_eq!(backwards.is_err(), cfg!(debug_assertions));
        let twice = std::thread::spawn(|| {
            let _a = Ordered::take(Level::Stripe, || ());
            let _b = Ordered::take(Level::Stripe, || ());
        })
        .join();
        assert_eq!(twice.is_err(), cfg!(debug_assertions));
    }
}
