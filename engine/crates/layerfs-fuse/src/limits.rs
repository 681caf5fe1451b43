//! The sizes the door agrees with the kernel at INIT, in one place: the
//! largest WRITE (and READ) and what a pipe of this process carries whole.

use std::sync::OnceLock;

use rustix::pipe::{fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, PipeFlags};

/// Largest WRITE the kernel may send; also its readahead. Where a pipe
/// cannot carry a READ this large, the door asks for less
/// ([`largest_read`]).
pub const MAX_WRITE: u32 = 1 << 20;

/// The pipe size asked for: the largest READ, its header's page and one
/// for an offset off a page boundary, as a power of two.
pub(crate) const WANTED: usize = (MAX_WRITE as usize + 2 * 4096).next_power_of_two();

/// The largest pipe this process may make, in bytes, up to [`WANTED`]:
/// tried once, on a pipe of its own.
pub(crate) fn largest_pipe() -> usize {
    static LARGEST: OnceLock<usize> = OnceLock::new();
    *LARGEST.get_or_init(|| {
        let Ok((_read, write)) = pipe_with(PipeFlags::CLOEXEC) else {
            return 0;
        };
        let allowed = || {
            let max = std::fs::read_to_string("/proc/sys/fs/pipe-max-size").ok()?;
            fcntl_setpipe_size(&write, max.trim().parse::<usize>().ok()?.min(WANTED)).ok()
        };
        fcntl_setpipe_size(&write, WANTED)
            .ok()
            .or_else(allowed)
            .or_else(|| fcntl_getpipe_size(&write).ok())
            .unwrap_or(0)
    })
}

/// The largest READ a pipe of this process carries whole, page-aligned
/// as the kernel's readahead asks: [`MAX_WRITE`] at most, and never below
/// the kernel's own 128 KiB (a user already past its pipes' limit, whose
/// READs are then copied, must not get small WRITEs too).
pub(crate) fn largest_read() -> usize {
    const KERNEL_DEFAULT: usize = 128 * 1024;
    match largest_pipe() {
        0 => MAX_WRITE as usize,
        bytes => {
            let pages = (bytes / rustix::param::page_size()).saturating_sub(1);
            (pages * rustix::param::page_size()).clamp(KERNEL_DEFAULT, MAX_WRITE as usize)
        }
    }
}
