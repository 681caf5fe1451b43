//! A READ answered by `splice`: the host file's pages go into a pipe
//! behind the answer's header, and from the pipe into `/dev/fuse`, where
//! the kernel copies them once, into the reader's pages. Read into a
//! buffer and written back, the same bytes are copied twice (out of the
//! host's page cache, into the kernel's request).
//!
//! Each thread has a pipe of its own, made at its first READ at the
//! kernel's default size (16 buffers), and grown to the first power of two
//! that holds each larger READ it is sent. A pipe holds a page per buffer,
//! and the header takes one: a 128 KiB READ needs a 256 KiB pipe, a 1 MiB
//! READ a 2 MiB one, which `/proc/sys/fs/pipe-max-size` (1 MiB by default)
//! allows only to a process with CAP_SYS_RESOURCE. Elsewhere the door's
//! readahead is kept to what the largest pipe allowed carries
//! ([`largest_read`]: 1020 KiB). Pipes are counted against their user
//! (`pipe-user-pages-soft`, 64 MiB by default, for a user without
//! CAP_SYS_RESOURCE or CAP_SYS_ADMIN), so a pipe grows only as far as its
//! thread's READs need: a user's daemon of many mounts keeps a small pipe
//! in each. A pipe that may not grow (the user is past that limit) stays
//! as it is, and a READ larger than it holds, or one whose file has shrunk
//! since its size was read, is answered by a copy instead. The pipe is
//! empty after every answer, sent or not: what stayed in it would go out
//! with the next.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use layerfs_vfs::ReadSource;
use rustix::pipe::{fcntl_getpipe_size, fcntl_setpipe_size, pipe_with, PipeFlags, SpliceFlags};
use zerocopy::IntoBytes;

use crate::limits::largest_pipe;
use crate::wire::{self, OUT_HEADER_LEN};

/// One thread's pipe.
pub(crate) struct Splicer {
    read: OwnedFd,
    write: OwnedFd,
    /// The pipe's buffers, a page each at most.
    buffers: usize,
    /// Whether the kernel refused to grow the pipe: it is not asked again.
    refused: bool,
}

/// What became of an answer given to [`Splicer::send`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Written, or refused by the kernel with `Errno`.
    Done(rustix::io::Result<()>),
    /// Not sent: too large for the pipe, or the file had fewer bytes than
    /// its source said. To be answered by a copy.
    Copy,
}

impl Splicer {
    pub(crate) fn new() -> io::Result<Splicer> {
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let buffers = fcntl_getpipe_size(&write)? / rustix::param::page_size();
        Ok(Splicer {
            read,
            write,
            buffers,
            refused: false,
        })
    }

    /// The buffers an answer of `len` bytes from `offset` takes: one for
    /// the header, and one for each page the range spans.
    fn needed(offset: u64, len: usize) -> usize {
        let page = rustix::param::page_size() as u64;
        let first = offset / page;
        let end = (offset + len as u64).div_ceil(page);
        (end - first) as usize + 1
    }

    /// Whether the pipe holds an answer of `len` bytes from `offset`,
    /// grown to hold it where it may be.
    fn holds(&mut self, offset: u64, len: usize) -> bool {
        let needed = Self::needed(offset, len);
        if needed <= self.buffers {
            return true;
        }
        let page = rustix::param::page_size();
        let size = (needed * page).next_power_of_two();
        if self.refused || size > largest_pipe() {
            return false;
        }
        // The pipe is empty between answers, so any size is one it can take.
        match fcntl_setpipe_size(&self.write, size) {
            Ok(size) => self.buffers = size / page,
            Err(e) => {
                tracing::debug!(
                    "a pipe of {} buffers not grown to {size} bytes ({e}): larger READs are copied",
                    self.buffers
                );
                self.refused = true;
            }
        }
        needed <= self.buffers
    }

    /// Sends `device` the answer to READ `unique`: a header, then
    /// `source`'s bytes, straight from the host file.
    pub(crate) fn send(&mut self, device: impl AsFd, unique: u64, source: &ReadSource) -> Sent {
        if !self.holds(source.offset, source.len) {
            tracing::debug!(
                "a READ of {} at {} is copied: a pipe of {} buffers cannot hold it",
                source.len,
                source.offset,
                self.buffers
            );
            return Sent::Copy;
        }
        let sent = self.fill(unique, source).and_then(|full| match full {
            true => self.empty_into(device.as_fd(), OUT_HEADER_LEN + source.len),
            false => Ok(false),
        });
        let sent = match sent {
            Ok(true) => Sent::Done(Ok(())),
            Ok(false) => Sent::Copy,
            Err(e) => Sent::Done(Err(e)),
        };
        if sent != Sent::Done(Ok(())) {
            self.drain();
        }
        sent
    }

    /// Puts the header and every byte of `source` in the pipe; false where
    /// the file ended first.
    fn fill(&self, unique: u64, source: &ReadSource) -> rustix::io::Result<bool> {
        let header = wire::out_header(unique, 0, source.len);
        if rustix::io::write(&self.write, header.as_bytes())? != OUT_HEADER_LEN {
            return Ok(false);
        }
        let mut offset = source.offset;
        let mut left = source.len;
        while left > 0 {
            let flags = SpliceFlags::empty();
            match rustix::pipe::splice(
                &*source.file,
                Some(&mut offset),
                &self.write,
                None,
                left,
                flags,
            ) {
                Ok(0) => return Ok(false),
                Ok(n) => left -= n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Moves the `len` bytes in the pipe into `device` as one answer.
    fn empty_into(
        &self,
        device: std::os::fd::BorrowedFd<'_>,
        len: usize,
    ) -> rustix::io::Result<bool> {
        loop {
            match rustix::pipe::splice(&self.read, None, device, None, len, SpliceFlags::empty()) {
                Ok(n) if n == len => return Ok(true),
                // The kernel takes an answer whole or not at all.
                Ok(_) => return Err(rustix::io::Errno::IO),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Empties the pipe of what an answer not sent left in it.
    fn drain(&self) {
        let mut sink = [0u8; 64 * 1024];
        while matches!(rustix::io::read(&self.read, &mut sink), Ok(n) if n > 0) {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use layerfs_vfs::hostdir::host_attr;

    use super::*;
    use crate::limits::{largest_read, WANTED};

    fn source(file: &std::path::Path, offset: u64, len: usize) -> ReadSource {
        let file = OwnedFd::from(std::fs::File::open(file).unwrap());
        ReadSource {
            attr: host_attr(file.as_fd()).unwrap(),
            file: Arc::new(file),
            offset,
            len,
            eof: false,
        }
    }

    /// A pipe standing for `/dev/fuse`, as large as a splicer's.
    fn device() -> (OwnedFd, OwnedFd) {
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK).unwrap();
        fcntl_setpipe_size(&write, largest_pipe()).unwrap();
        (read, write)
    }

    fn received(device: &OwnedFd) -> Vec<u8> {
        let mut got = vec![0u8; WANTED];
        let n = rustix::io::read(device, &mut got).unwrap_or(0);
        got.truncate(n);
        got
    }

    #[test]
    fn an_answer_is_its_header_then_the_files_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..600_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(dir.path().join("f"), &content).unwrap();
        let mut splicer = Splicer::new().unwrap();
        let largest = largest_read();
        assert!(largest >= 128 * 1024, "the largest READ: {largest}");
        assert!(splicer.holds(4096, largest) && !splicer.holds(0, largest_pipe()));
        let (out, into) = device();
        for (offset, len) in [
            (0u64, 4096usize),
            (1000, 131_072),
            (4096, largest),
            (599_000, 1000),
            (5, 0),
        ] {
            let len = len.min(content.len() - offset as usize);
            let sent = splicer.send(&into, 77, &source(&dir.path().join("f"), offset, len));
            assert_eq!(sent, Sent::Done(Ok(())));
            let got = received(&out);
            let header = wire::out_header(77, 0, len);
            assert_eq!(&got[..OUT_HEADER_LEN], header.as_bytes());
            let at = offset as usize;
            assert_eq!(
                &got[OUT_HEADER_LEN..],
                &content[at..at + len],
                "at {offset}"
            );
        }
    }

    #[test]
    fn a_pipe_grows_only_as_far_as_the_reads_it_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![3u8; 2 << 20]).unwrap();
        let page = rustix::param::page_size();
        let mut splicer = Splicer::new().unwrap();
        let (out, into) = device();
        let start = splicer.buffers;
        assert!(start <= 16, "a new pipe of {start} buffers");
        // (offset, length, buffers the pipe has after): a power of two
        // of pages, never smaller than before.
        let largest = largest_read();
        for (offset, len, buffers) in [
            (0, 4096, start),
            (0, 128 * 1024, 64),
            (1000, 128 * 1024, 64),
            (0, 4096, 64),
            (4096, largest, largest_pipe() / page),
        ] {
            let sent = splicer.send(&into, 5, &source(&dir.path().join("f"), offset, len));
            assert_eq!(sent, Sent::Done(Ok(())), "{len} at {offset}");
            assert_eq!(received(&out).len(), OUT_HEADER_LEN + len);
            assert_eq!(splicer.buffers, buffers, "after {len} at {offset}");
        }
        // Past the largest pipe allowed: copied, the pipe as it was.
        let past = source(&dir.path().join("f"), 0, largest_pipe());
        assert_eq!(splicer.send(&into, 6, &past), Sent::Copy);
        assert_eq!(splicer.buffers, largest_pipe() / page);
        assert!(!splicer.refused, "not asked beyond what is allowed");
    }

    #[test]
    fn a_file_shorter_than_its_source_is_copied_and_nothing_is_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 10_000]).unwrap();
        let mut splicer = Splicer::new().unwrap();
        let (out, into) = device();
        let shrunk = source(&dir.path().join("f"), 8_000, 4_000);
        assert_eq!(splicer.send(&into, 1, &shrunk), Sent::Copy);
        assert!(received(&out).is_empty(), "nothing sent");
        // The next answer goes out alone.
        let whole = source(&dir.path().join("f"), 0, 100);
        assert_eq!(splicer.send(&into, 2, &whole), Sent::Done(Ok(())));
        assert_eq!(received(&out).len(), OUT_HEADER_LEN + 100);
    }

    #[test]
    fn an_answer_the_device_refuses_leaves_the_pipe_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![1u8; 8192]).unwrap();
        let mut splicer = Splicer::new().unwrap();
        // A pipe too small for the answer: the splice out takes part of it.
        let (out, into) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK).unwrap();
        fcntl_setpipe_size(&into, 4096).unwrap();
        let sent = splicer.send(&into, 1, &source(&dir.path().join("f"), 0, 8192));
        assert!(matches!(sent, Sent::Done(Err(_))), "{sent:?}");
        drop((out, into));
        let (out, into) = device();
        assert_eq!(
            splicer.send(&into, 2, &source(&dir.path().join("f"), 0, 10)),
            Sent::Done(Ok(()))
        );
        assert_eq!(
            received(&out).len(),
            OUT_HEADER_LEN + 10,
            "no bytes of the first"
        );
    }
}
