//! Sending replies: each reply's mark and body leave in one write.
//!
//! A reply is framed as one buffer (mark first, see [`ReplyBuf`]), so a lone
//! reply is one `write` and never meets Nagle's algorithm as a 4-byte segment.
//! Replies finished while another is being written queue up and the writing
//! thread sends them all in one vectored write before it lets go.
//!
//! The one exception is a reply whose body ends in file data (a READ): its
//! in-memory part is written, then the kernel sends the file's pages straight
//! to the socket ([`Transmit::send_file`]), so the data is never copied
//! through user space. TCP_NODELAY is set, so the short first part does not
//! wait for an acknowledgement.

use parking_lot::Mutex;
use std::io::{self, IoSlice, Write};
use std::mem;
#[cfg(target_os = "linux")]
use std::os::fd::AsFd;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::record::last_fragment_mark;

use crate::spares::{self, SPARES};

/// Bytes of an open file that end a reply's body on the wire.
#[derive(Clone, Debug)]
pub struct FileTail {
    pub file: Arc<OwnedFd>,
    pub offset: u64,
    pub len: usize,
}

/// A reply ready for the wire: `bytes` (mark first), then the file tail if
/// any, then `pad` zero bytes to XDR's four-byte boundary.
#[derive(Clone, Debug)]
pub struct Frame {
    bytes: Vec<u8>,
    tail: Option<FileTail>,
    pad: usize,
}

impl Frame {
    /// The in-memory part: the whole frame unless it has a file tail.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn tail(&self) -> Option<&FileTail> {
        self.tail.as_ref()
    }

    /// Bytes on the wire, mark included.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.tail.as_ref().map_or(0, |t| t.len) + self.pad
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A reply under construction: four bytes reserved for the record mark, then
/// the RPC reply body, so framing needs no second buffer or copy.
#[derive(Debug)]
pub struct ReplyBuf {
    bytes: Vec<u8>,
    tail: Option<FileTail>,
    /// The program asked for [`Program::after_reply`](crate::Program::after_reply).
    call_back: bool,
}

/// The room every reply starts with, at the least: the largest reply that
/// does not reserve its own (a LOOKUP's or a CREATE's: a handle and three
/// sets of attributes) fits, so a reply is one allocation and never grows
/// field by field. Replies with data or listings reserve what they need.
pub const FIRST_ROOM: usize = 512;

impl ReplyBuf {
    /// A reply with room for `body` bytes after the mark, and at least
    /// [`FIRST_ROOM`].
    pub fn with_capacity(body: usize) -> Self {
        let mut bytes = Vec::with_capacity(4 + body.max(FIRST_ROOM));
        bytes.extend_from_slice(&[0; 4]);
        ReplyBuf {
            bytes,
            tail: None,
            call_back: false,
        }
    }

    /// Ends the body with `tail.len` bytes of a file (and XDR padding); nothing
    /// may be appended after it.
    pub fn set_file_tail(&mut self, tail: FileTail) {
        self.tail = Some(tail);
    }

    /// Asks for [`Program::after_reply`](crate::Program::after_reply) with
    /// this call once the reply has left: work the client need not wait
    /// for. Only for a call that succeeds; a refusal's reply is another.
    pub fn call_back_after_sending(&mut self) {
        self.call_back = true;
    }

    /// Whether [`call_back_after_sending`](Self::call_back_after_sending) was asked.
    pub fn calls_back(&self) -> bool {
        self.call_back
    }

    /// The body written so far.
    pub fn body(&self) -> &[u8] {
        &self.bytes[4..]
    }

    /// Appends raw bytes to the body.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    pub fn body_len(&self) -> usize {
        self.bytes.len() - 4
    }

    /// Appends to the body in place through `fill` (such as reading file
    /// data straight into a READ reply), which may only append.
    pub fn append_with<R>(&mut self, fill: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let len = self.bytes.len();
        let filled = fill(&mut self.bytes);
        assert!(
            self.bytes.len() >= len,
            "a reply body was cut while appending"
        );
        filled
    }

    /// Cuts the body back to its first `len` bytes (results abandoned part
    /// way, for an error reply instead).
    pub fn truncate_body(&mut self, len: usize) {
        self.bytes.truncate(4 + len);
    }

    /// Overwrites body bytes at `at` (a header reserved before its contents were known).
    pub fn patch_body(&mut self, at: usize, bytes: &[u8]) {
        self.bytes[4 + at..4 + at + bytes.len()].copy_from_slice(bytes);
    }

    /// Room for `additional` more bytes; a reply growing large takes a
    /// buffer a sent reply or a finished call left (see `spares.rs`).
    pub fn reserve(&mut self, additional: usize) {
        let needed = self.bytes.len() + additional;
        if needed >= spares::LARGE && self.bytes.capacity() < needed {
            if let Some(mut spare) = SPARES.take(needed) {
                spare.extend_from_slice(&self.bytes);
                self.bytes = spare;
            }
        }
        self.bytes.reserve(additional);
    }

    /// Mark and body, ready for the wire: one last fragment.
    pub fn into_frame(mut self) -> Frame {
        let tail_len = self.tail.as_ref().map_or(0, |t| t.len);
        let pad = crate::xdr::padding(tail_len);
        let mark = last_fragment_mark(self.body_len() + tail_len + pad);
        self.bytes[..4].copy_from_slice(&mark);
        Frame {
            bytes: self.bytes,
            tail: self.tail,
            pad,
        }
    }
}

/// A stream replies can be written to.
pub trait Transmit: Write {
    /// A vectored write of bytes that more will follow at once (a reply's
    /// head before its file tail): a socket holds them to leave with what
    /// follows instead of as a small segment of their own.
    fn write_vectored_more(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.write_vectored(bufs)
    }

    /// Sends all of `tail`'s bytes. This default reads them through a
    /// buffer; a socket sends them from the page cache instead.
    fn send_file(&mut self, tail: &FileTail) -> io::Result<u64> {
        let mut buf = vec![0; tail.len.min(256 * 1024)];
        let mut sent = 0;
        while sent < tail.len {
            let want = (tail.len - sent).min(buf.len());
            let n =
                match rustix::io::pread(&*tail.file, &mut buf[..want], tail.offset + sent as u64) {
                    Ok(n) => n,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                };
            if n == 0 {
                // The file shrank after the reply promised these bytes.
                buf[..want].fill(0);
                self.write_all(&buf[..want])?;
                sent += want;
                continue;
            }
            self.write_all(&buf[..n])?;
            sent += n;
        }
        Ok(1)
    }
}

impl Transmit for std::net::TcpStream {
    #[cfg(target_os = "linux")]
    fn write_vectored_more(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendFlags};
        Ok(sendmsg(
            self.as_fd(),
            bufs,
            &mut SendAncillaryBuffer::default(),
            SendFlags::MORE,
        )?)
    }

    #[cfg(target_os = "linux")]
    fn send_file(&mut self, tail: &FileTail) -> io::Result<u64> {
        let mut offset = tail.offset;
        let end = tail.offset + tail.len as u64;
        let mut calls = 0;
        while offset < end {
            calls += 1;
            let want = (end - offset) as usize;
            match rustix::fs::sendfile(self.as_fd(), &*tail.file, Some(&mut offset), want) {
                Ok(0) => {
                    // The file shrank after the reply promised these bytes:
                    // keep the stream in step with zeros.
                    self.write_all(&vec![0; (end - offset) as usize])?;
                    break;
                }
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(calls)
    }
}

/// Appending, so XDR encoders write straight into the reply.
/// Inlined: XDR encoders write a field of four or eight bytes at a time.
impl Write for ReplyBuf {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.bytes.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Default)]
struct ReplyQueue {
    frames: Vec<Frame>,
    /// A thread is writing; it will also send what is queued.
    writing: bool,
    /// A write failed: the connection is going away, drop further replies.
    broken: bool,
}

/// Writes framed replies to one connection from any thread.
pub struct ReplyWriter<W> {
    queue: Mutex<ReplyQueue>,
    /// Held only by the thread whose `writing` flag is set, so never contended.
    stream: Mutex<W>,
    writes: AtomicU64,
    bytes_out: AtomicU64,
}

impl<W: Transmit> ReplyWriter<W> {
    pub fn new(stream: W) -> Self {
        ReplyWriter {
            queue: Mutex::new(ReplyQueue::default()),
            stream: Mutex::new(stream),
            writes: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
        }
    }

    pub fn into_inner(self) -> W {
        self.stream.into_inner()
    }

    /// `write` calls made so far (and `sendfile` calls, on Linux).
    pub fn writes(&self) -> u64 {
        self.writes.load(Relaxed)
    }

    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Relaxed)
    }

    /// Sends one framed reply (from [`ReplyBuf::into_frame`]), now or as part
    /// of the batch another thread is writing. An error means the connection
    /// can take no more replies.
    pub fn send(&self, frame: Frame) -> io::Result<()> {
        self.send_all(vec![frame])
    }

    /// Sends several framed replies, in one write when nothing else is queued.
    pub fn send_all(&self, mut frames: Vec<Frame>) -> io::Result<()> {
        if frames.is_empty() {
            return Ok(());
        }
        let mut queue = self.queue.lock();
        if queue.broken {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        queue.frames.append(&mut frames);
        if queue.writing {
            return Ok(());
        }
        queue.writing = true;
        loop {
            let batch = mem::take(&mut queue.frames);
            drop(queue);
            let result = self.write_batch(&batch);
            for frame in batch {
                SPARES.give_back(frame.bytes);
            }
            queue = self.queue.lock();
            if let Err(e) = result {
                queue.writing = false;
                queue.broken = true;
                queue.frames.clear();
                return Err(e);
            }
            if queue.frames.is_empty() {
                queue.writing = false;
                return Ok(());
            }
        }
    }

    /// Writes frames in order: in-memory parts gathered into vectored writes,
    /// each file tail sent by the kernel where it falls.
    fn write_batch(&self, frames: &[Frame]) -> io::Result<()> {
        let mut stream = self.stream.lock();
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(frames.len());
        for frame in frames {
            slices.push(IoSlice::new(&frame.bytes));
            if let Some(tail) = &frame.tail {
                self.write_slices(&mut *stream, &mut slices, true)?;
                let calls = stream.send_file(tail)?;
                self.writes.fetch_add(calls, Relaxed);
                self.bytes_out.fetch_add(tail.len as u64, Relaxed);
                slices.push(IoSlice::new(&[0; 3][..frame.pad]));
            }
        }
        self.write_slices(&mut *stream, &mut slices, false)
    }

    /// One vectored write of `slices`, continued after partial writes; empties
    /// them. `more`: the bytes that follow are sent at once, by other calls.
    fn write_slices(
        &self,
        stream: &mut W,
        slices: &mut Vec<IoSlice<'_>>,
        more: bool,
    ) -> io::Result<()> {
        slices.retain(|s| !s.is_empty());
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            self.writes.fetch_add(1, Relaxed);
            let written = if more {
                stream.write_vectored_more(rest)
            } else {
                stream.write_vectored(rest)
            };
            match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.bytes_out.fetch_add(n as u64, Relaxed);
                    IoSlice::advance_slices(&mut rest, n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        slices.clear();
        Ok(())
    }
}
