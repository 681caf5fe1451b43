//! Requests read from `/dev/fuse`, answered by the one dispatcher
//! ([`crate::wire`]) that answers the rings' too.
//!
//! The INIT is answered before these threads start
//! ([`crate::connection::Connection::start`]); every request after it is
//! read here. Each thread reads one request at a time
//! into a buffer of its own, as large as the largest WRITE with its headers
//! (the kernel refuses a read into less), and writes the answer with one
//! `writev`: the out header, then the body where it lies. A READ of a host
//! file is spliced from the file into `/dev/fuse` ([`splice`]), or where
//! it cannot be, read straight into the buffer the answer goes out from.
//!
//! The kernel expects no answer to a FORGET or BATCH_FORGET. An INTERRUPT
//! is answered ENOSYS, as any request the door does not serve: the kernel
//! then sends this connection no more of them. [`step`] holds all of that
//! without I/O; [`Readers`] reads and writes.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use zerocopy::{FromBytes, IntoBytes};

use layerfs_vfs::ReadSource;

use crate::abi::{opcode, InHeader, OutHeader};
use crate::door::Door;
use crate::limits::MAX_WRITE;
use crate::request::Request;
use crate::wire::{self, Answered, Body, IN_HEADER_LEN};
use splice::{Sent, Splicer};

mod splice;

/// A thread's request buffer: the largest WRITE, its `fuse_write_in` and
/// header, and room for extensions.
const REQUEST_LEN: usize = MAX_WRITE as usize + 4096;

/// One thread's buffers, kept from request to request. Allocated zeroed:
/// a page is resident once a request has used it.
pub(crate) struct Buffers {
    request: Vec<u8>,
    answered: Answered,
    /// Where a READ's data is read to; made at the first READ.
    data: Vec<u8>,
    /// Whether the last answer's body is in `data`, not in `answered`.
    direct: bool,
    /// Whether `request` was made resident, at the first WRITE
    /// ([`crate::resident`]).
    resident: bool,
    /// The pipe READs are spliced through, made at the first; None after
    /// it could not be made (then READs are copied).
    splicer: Option<Option<Splicer>>,
}

impl Buffers {
    pub(crate) fn new() -> Buffers {
        Buffers {
            request: vec![0; REQUEST_LEN],
            answered: Answered::default(),
            data: Vec::new(),
            direct: false,
            resident: false,
            splicer: None,
        }
    }

    /// Splices the answer to READ `unique` from `source` into `device`.
    fn splice(&mut self, device: &OwnedFd, unique: u64, source: &ReadSource) -> Sent {
        let splicer = self.splicer.get_or_insert_with(|| {
            Splicer::new()
                .inspect_err(|e| tracing::warn!("no pipe to splice READs through ({e}): copied"))
                .ok()
        });
        match splicer {
            Some(splicer) => splicer.send(device, unique, source),
            None => Sent::Copy,
        }
    }

    /// Answers READ `unique` with `source`'s bytes read into the buffer
    /// the answer is written from.
    pub(crate) fn copy(&mut self, unique: u64, source: &ReadSource) -> OutHeader {
        if self.data.is_empty() {
            self.data = vec![0; MAX_WRITE as usize];
        }
        self.direct = true;
        let len = source.len.min(self.data.len());
        match crate::door::read_from(source, &mut self.data[..len]) {
            Ok(len) => wire::out_header(unique, 0, len),
            Err(e) => wire::out_header(unique, -e.code(), 0),
        }
    }

    /// Where the next request is read to.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn request_mut(&mut self) -> &mut [u8] {
        &mut self.request
    }

    /// The body of the answer `step` gave, `out` its header.
    pub(crate) fn body(&self, out: &OutHeader) -> &[u8] {
        let len = out.len as usize - wire::OUT_HEADER_LEN;
        match self.direct {
            true => &self.data[..len],
            false => &self.answered.body[..len],
        }
    }
}

/// What to do once a request was read.
#[derive(Debug)]
pub(crate) enum Then {
    /// Write this header and the body the buffers hold.
    Answer(OutHeader),
    /// Answer READ `unique` with the bytes of this range of a host file.
    Read(u64, ReadSource),
    /// Nothing: the kernel expects no answer.
    Nothing,
    /// Write this header, then read no more: the session is over.
    AnswerAndEnd(OutHeader),
}

/// Answers the request in the first `len` bytes of `buffers.request` with
/// `door`.
pub(crate) fn step(door: &Door, buffers: &mut Buffers, len: usize) -> Then {
    let Buffers {
        request,
        answered,
        direct,
        resident,
        ..
    } = buffers;
    *direct = false;
    let Ok((header, _)) = InHeader::read_from_prefix(&request[..len]) else {
        // No header, no one to answer: the kernel never sends one.
        tracing::warn!("a FUSE request of {len} bytes, too short for its header: ignored");
        return Then::Nothing;
    };
    if header.len as usize != len {
        tracing::warn!(
            "FUSE request {} says {} bytes and is {len}: answered EIO",
            header.opcode,
            header.len
        );
        return Then::Answer(wire::out_header(header.unique, -libc::EIO, 0));
    }
    let args = &request[IN_HEADER_LEN..len];
    match header.opcode {
        opcode::FORGET | opcode::BATCH_FORGET => {
            door.forgotten();
            return Then::Nothing;
        }
        opcode::WRITE if !*resident => {
            crate::resident::make_resident(request);
            *resident = true;
        }
        opcode::DESTROY => return Then::AnswerAndEnd(wire::out_header(header.unique, 0, 0)),
        _ => {}
    }
    let request = Request::parse(header.opcode, Body::whole(args, header.total_extlen));
    if let Ok(Request::Read(read)) = &request {
        let ino = crate::types::INodeNo(header.nodeid);
        if let Some(source) = door.read_source(ino, read.offset, read.size as usize) {
            door.answered_through_device();
            return Then::Read(header.unique, source);
        }
    }
    if header.opcode != opcode::INTERRUPT {
        door.answered_through_device();
    }
    wire::answer(door, &header, request, answered);
    Then::Answer(wire::out_header(
        header.unique,
        answered.error,
        answered.body.len(),
    ))
}

/// The threads reading one connection's `/dev/fuse`.
pub(crate) struct Readers {
    threads: Vec<JoinHandle<()>>,
}

/// Each thread serving a session zeroes a read buffer of over 1 MiB (the
/// largest WRITE and its headers, [`crate::devfuse`]), of which a request
/// touches what it holds. Once a buffer that large is freed, glibc raises its threshold for
/// mapping allocations to that size and serves the next ones from a heap,
/// where zeroing touches every page: measured, 50 mounts of the daemon took
/// 1 GB resident and kept 400 MB after their unmount. A fixed threshold
/// keeps each such buffer a mapping of its own, resident only where used
/// and returned whole when freed.
#[allow(unsafe_code)]
fn map_large_buffers() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt takes two integers and changes a setting of the
        // allocator, which glibc makes safe to call at any time.
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
        if set != 1 {
            tracing::debug!("glibc kept its mapping threshold");
        }
    }
}

impl Readers {
    /// Serves `device` with `door` on `threads` threads. The first reads
    /// `device` itself; with `clone`, each other reads a clone of it
    /// (FUSE_DEV_IOC_CLONE), else `device` too. A request read through
    /// `device` is sent again to the next server when this one dies (its
    /// keeper holds `device`); one read through a clone is failed.
    pub(crate) fn start(
        device: &OwnedFd,
        door: Arc<Door>,
        threads: usize,
        clone: bool,
    ) -> io::Result<Readers> {
        static LARGE_BUFFERS_MAPPED: std::sync::Once = std::sync::Once::new();
        LARGE_BUFFERS_MAPPED.call_once(map_large_buffers);
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads.max(1) {
            let fd = match i > 0 && clone {
                true => clone_device(device)?,
                false => device.try_clone()?,
            };
            let door = door.clone();
            let thread = std::thread::Builder::new()
                .name(format!("fuse-{i}"))
                .spawn(move || read_and_answer(&fd, &door))?;
            handles.push(thread);
        }
        Ok(Readers { threads: handles })
    }

    /// Whether every thread has ended: the connection is gone.
    pub(crate) fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Waits for every thread to end, as each does once the connection
    /// has ended.
    pub(crate) fn join(self) {
        for thread in self.threads {
            if thread.join().is_err() {
                tracing::error!("a thread reading /dev/fuse panicked");
            }
        }
    }
}

/// Reads and answers requests until the connection ends.
fn read_and_answer(device: &OwnedFd, door: &Door) {
    use rustix::io::Errno;
    let mut buffers = Buffers::new();
    loop {
        let len = match rustix::io::read(device, &mut buffers.request) {
            Ok(len) => len,
            // ENOENT: the request was interrupted before it was read.
            Err(Errno::INTR | Errno::AGAIN | Errno::NOENT) => continue,
            // Unmounted (ENODEV; ECONNABORTED met once too) or aborted.
            Err(Errno::NODEV | Errno::CONNABORTED) => return,
            Err(e) => return tracing::error!("reading /dev/fuse: {e}: this thread stops"),
        };
        let (out, end) = match step(door, &mut buffers, len) {
            Then::Nothing => continue,
            Then::Answer(out) => (out, false),
            Then::AnswerAndEnd(out) => (out, true),
            Then::Read(unique, source) => match buffers.splice(device, unique, &source) {
                Sent::Done(written) => {
                    match written {
                        Ok(()) | Err(Errno::NOENT) => {}
                        Err(Errno::NODEV) => return,
                        Err(e) => tracing::warn!("answering FUSE READ {unique}: {e}"),
                    }
                    continue;
                }
                Sent::Copy => (buffers.copy(unique, &source), false),
            },
        };
        let answer = [
            IoSlice::new(out.as_bytes()),
            IoSlice::new(buffers.body(&out)),
        ];
        match write_all_at_once(device, &answer) {
            // ENOENT: the caller was interrupted, and its request ended.
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::NODEV) => return,
            Err(e) => tracing::warn!("answering FUSE request {}: {e}", out.unique),
        }
        if end {
            return;
        }
    }
}

/// The kernel takes an answer in one `writev` or not at all.
fn write_all_at_once(device: &OwnedFd, answer: &[IoSlice<'_>]) -> rustix::io::Result<()> {
    loop {
        match rustix::io::writev(device, answer) {
            Err(rustix::io::Errno::INTR) => continue,
            other => return other.map(drop),
        }
    }
}

/// A new descriptor of `device`'s connection, read apart from it.
#[allow(unsafe_code)]
fn clone_device(device: &OwnedFd) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let clone = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let source = device.as_raw_fd() as u32;
    // SAFETY: the ioctl reads one u32 (the descriptor to clone) through
    // the pointer the Setter passes, and both descriptors are open.
    unsafe {
        rustix::ioctl::ioctl(
            &clone,
            rustix::ioctl::Setter::<{ crate::abi::DEV_IOC_CLONE }, u32>::new(source),
        )
    }?;
    Ok(clone)
}

#[cfg(test)]
mod tests;
