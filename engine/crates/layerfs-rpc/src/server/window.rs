//! The window of calls in flight on one connection: when it is full the
//! connection's reader stops reading, so a client that pipelines without
//! limit holds at most `size` records in server memory.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

/// Calls in flight on one connection, at most `size`.
///
/// A slot is held from the call's hand-off until its reply is sent, so a
/// client that reads no replies stops the reader; the call counts as
/// running only until its reply is made, so a client that sends its next
/// call on reading the reply finds the connection idle.
pub(super) struct Window {
    in_flight: Mutex<usize>,
    freed: Condvar,
    size: usize,
    running: AtomicU64,
}

impl Window {
    pub(super) fn new(size: usize) -> Self {
        Window {
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
            size: size.max(1),
            running: AtomicU64::new(0),
        }
    }

    pub(super) fn try_acquire(&self) -> bool {
        let mut n = self.in_flight.lock();
        let free = *n < self.size;
        if free {
            *n += 1;
            self.running.fetch_add(1, Relaxed);
        }
        free
    }

    pub(super) fn acquire(&self) {
        let mut n = self.in_flight.lock();
        while *n >= self.size {
            self.freed.wait(&mut n);
        }
        *n += 1;
        self.running.fetch_add(1, Relaxed);
    }

    /// The call's reply is made (or it has none): it no longer runs.
    pub(super) fn answered(&self) {
        self.running.fetch_sub(1, Release);
    }

    /// The call's reply is sent: its slot is free.
    pub(super) fn release(&self) {
        *self.in_flight.lock() -= 1;
        self.freed.notify_all();
    }

    pub(super) fn is_busy(&self) -> bool {
        *self.in_flight.lock() > 0
    }

    /// Whether a call handed off is still running, its reply not yet made.
    pub(super) fn is_running(&self) -> bool {
        self.running.load(Acquire) > 0
    }

    /// Waits until every call in flight has finished.
    pub(super) fn drain(&self) {
        let mut n = self.in_flight.lock();
        while *n > 0 {
            self.freed.wait(&mut n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_window_admits_no_more_until_a_reply_leaves() {
        let w = Window::new(2);
        assert!(w.try_acquire() && w.try_acquire());
        assert!(!w.try_acquire(), "full at its size");
        assert!(w.is_busy() && w.is_running());
        w.answered();
        assert!(
            !w.try_acquire(),
            "answered is not sent: the slot is still held"
        );
        w.release();
        assert!(w.try_acquire());
        w.answered();
        w.answered();
        assert!(!w.is_running());
        w.release();
        w.release();
        assert!(!w.is_busy());
        w.drain();
    }
}
