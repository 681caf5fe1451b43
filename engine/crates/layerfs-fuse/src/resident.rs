//! The request buffer a door's thread reads into, kept resident.
//!
//! The kernel copies each request into the buffer of the thread that reads
//! it. Where that copy has to fault in a page of the buffer and the door
//! has been sent SIGKILL, the copy fails, and the kernel ends the request
//! with EIO rather than keep it for the next server of the session
//! (`FUSE_NOTIFY_RESEND`, see [`crate::handover`]). A writeback WRITE so
//! ended comes back as EIO from the writer's next `fsync`: a daemon killed
//! under a user's writes broke them in about one run in ten of
//! `tests/daemon/fuse.sh` (traced once: a WRITE ended with no answer by the
//! dying daemon's thread), and in none of 30 since. Pages the kernel has
//! written stay resident (nothing here is swapped out unless the machine
//! swaps), so only a request reaching pages none reached before is at risk:
//! at a thread's first WRITE its whole buffer is made resident
//! ([`crate::devfuse`]). That costs 1 MiB per thread that is sent WRITEs; a
//! door that passes its files through is sent none.

/// Makes every page of `buffer` resident and writable, changing no byte.
pub(crate) fn make_resident(buffer: &[u8]) {
    if let Err(e) = populate(buffer.as_ptr(), buffer.len()) {
        tracing::debug!("the request buffer was not made resident: {e}");
    }
}

/// `MADV_POPULATE_WRITE` (Linux 5.14) over the pages of `len` bytes from
/// `start`: each is faulted in as a write would, and nothing is written.
#[allow(unsafe_code)]
fn populate(start: *const u8, len: usize) -> std::io::Result<()> {
    let page = rustix::param::page_size();
    let first = start as usize & !(page - 1);
    let end = (start as usize + len).next_multiple_of(page);
    // SAFETY: the range is memory of this process (the buffer `start`
    // points into, see `make_resident`), and populating changes no byte
    // of it: present pages stay as they are, absent ones are filled with
    // the zeros they already read as.
    unsafe {
        rustix::mm::madvise(
            first as *mut std::ffi::c_void,
            end - first,
            rustix::mm::Advice::LinuxPopulateWrite,
        )?
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh anonymous mapping of `len` bytes, as a large zeroed `Vec`
    /// is: no page resident until touched.
    struct Mapping(*mut u8, usize);

    impl Mapping {
        #[allow(unsafe_code)]
        fn new(len: usize) -> Mapping {
            use rustix::mm::{mmap_anonymous, MapFlags, ProtFlags};
            // SAFETY: a new private mapping, at an address the kernel picks.
            let at = unsafe {
                mmap_anonymous(
                    std::ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::PRIVATE,
                )
            }
            .unwrap();
            Mapping(at.cast(), len)
        }

        #[allow(unsafe_code)]
        fn bytes(&self) -> &[u8] {
            // SAFETY: the mapping is readable for its length while `self`
            // lives, and nothing writes it.
            unsafe { std::slice::from_raw_parts(self.0, self.1) }
        }

        /// How many pages of `range` are resident (`mincore`).
        #[allow(unsafe_code)]
        fn resident(&self, range: std::ops::Range<usize>) -> usize {
            let page = rustix::param::page_size();
            assert!(range.start.is_multiple_of(page) && range.end <= self.1);
            let pages = (range.end - range.start).div_ceil(page);
            let mut map = vec![0u8; pages];
            // SAFETY: the range is within the mapping, and `map` has a
            // byte for each of its pages.
            let done = unsafe {
                libc::mincore(
                    self.0.add(range.start).cast(),
                    range.end - range.start,
                    map.as_mut_ptr(),
                )
            };
            assert_eq!(done, 0, "{}", std::io::Error::last_os_error());
            map.iter().filter(|&&b| b & 1 == 1).count()
        }
    }

    impl Drop for Mapping {
        #[allow(unsafe_code)]
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, no longer borrowed.
            let _ = unsafe { rustix::mm::munmap(self.0.cast(), self.1) };
        }
    }

    #[test]
    fn a_buffer_is_made_resident_and_left_as_it_was() {
        let page = rustix::param::page_size();
        let buffer = Mapping::new(4 << 20);
        let longest = 2 << 20;
        assert_eq!(buffer.resident(0..4 << 20), 0);
        make_resident(&buffer.bytes()[80..80 + longest]);
        let spanned = (80 + longest).div_ceil(page);
        assert_eq!(buffer.resident(0..spanned * page), spanned);
        assert_eq!(
            buffer.resident(spanned * page..4 << 20),
            0,
            "only the slice given is made resident"
        );
        assert!(buffer.bytes().iter().all(|&b| b == 0), "nothing written");
    }
}
