//! Large buffers kept for the next large reply or call.
//!
//! A listing's reply is hundreds of kilobytes, a large WRITE's call a
//! megabyte, each made and freed per call. The allocator hands pages of that
//! size back to the kernel when they are freed and faults them in again for
//! the next (7.6% of a READDIRPLUS server's time in `perf`, and a tenth of a
//! server's taking 1 MiB WRITEs on its workers, with glibc's malloc). So the
//! writer gives each large reply's buffer back here once it is sent, and a
//! connection each large call's once it has run; the next reply to grow past
//! [`LARGE`], or record to arrive that large, takes one. At most [`KEPT`]
//! buffers of at most [`LARGEST`] bytes each are kept: 8.5 MiB idle at
//! worst.

use parking_lot::Mutex;

/// Buffers at least this large are worth keeping.
pub const LARGE: usize = 64 * 1024;
/// Buffers larger than this are freed: READDIRPLUS replies are capped by
/// the client's maxcount, 1 MiB and less in practice, and a WRITE's call
/// by its wsize, 1 MiB, plus a header.
pub const LARGEST: usize = 1024 * 1024 + 64 * 1024;
/// Buffers kept at most: one per call in flight on a busy connection.
pub const KEPT: usize = 8;

/// The buffers kept: for every connection of this process.
pub static SPARES: Spares = Spares::new();

pub struct Spares {
    kept: Mutex<Vec<Vec<u8>>>,
}

impl Spares {
    pub const fn new() -> Spares {
        Spares {
            kept: Mutex::new(Vec::new()),
        }
    }

    /// An empty buffer with room for `len` bytes, if one is kept.
    pub fn take(&self, len: usize) -> Option<Vec<u8>> {
        let mut kept = self.kept.lock();
        let at = kept.iter().position(|b| b.capacity() >= len)?;
        Some(kept.swap_remove(at))
    }

    /// Keeps `buf` (its bytes sent, or its call run) for a later reply or
    /// call, if it is worth it and there is room.
    pub fn give_back(&self, mut buf: Vec<u8>) {
        if !(LARGE..=LARGEST).contains(&buf.capacity()) {
            return;
        }
        let mut kept = self.kept.lock();
        if kept.len() < KEPT {
            buf.clear();
            kept.push(buf);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_buffer_is_used_again_and_no_more_are_kept_than_allowed() {
        let spares = Spares::new();
        assert!(spares.take(LARGE).is_none());
        let buf = vec![7u8; 300 * 1024];
        let at = buf.as_ptr();
        spares.give_back(buf);
        // Too small for what is asked: not handed out.
        assert!(spares.take(400 * 1024).is_none());
        let again = spares.take(200 * 1024).expect("the buffer kept");
        assert_eq!(again.as_ptr(), at, "the same pages");
        assert!(again.is_empty() && again.capacity() >= 300 * 1024);
        assert_eq!(spares.len(), 0);

        // Small and oversized buffers are freed; past KEPT, the rest too.
        spares.give_back(Vec::with_capacity(LARGE - 1));
        spares.give_back(Vec::with_capacity(LARGEST + 1));
        assert_eq!(spares.len(), 0);
        for _ in 0..KEPT + 3 {
            spares.give_back(Vec::with_capacity(LARGE));
        }
        assert_eq!(spares.len(), KEPT);
    }
}
