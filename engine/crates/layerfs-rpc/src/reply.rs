//! Sending replies: each reply's mark and body leave in one write.
//!
//! A reply is framed as one buffer (mark first, see [`ReplyBuf`]), so a lone
//! reply is one `write` and never meets Nagle's algorithm as a 4-byte segment.
//! Replies finished while another is being written queue up and the writing
//! thread sends them all in one vectored write before it lets go.

use std::io::{self, IoSlice, Write};
use std::mem;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::record::last_fragment_mark;

/// A reply under construction: four bytes reserved for the record mark, then
/// the RPC reply body, so framing needs no second buffer or copy.
#[derive(Debug)]
pub struct ReplyBuf {
    bytes: Vec<u8>,
}

impl ReplyBuf {
    pub fn with_capacity(body: usize) -> Self {
        let mut bytes = Vec::with_capacity(4 + body);
        bytes.extend_from_slice(&[0; 4]);
        ReplyBuf { bytes }
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

    /// The whole buffer, mark bytes first, for appending in place (such as
    /// reading file data straight into a READ reply). Only append to it.
    pub fn as_mut_vec(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Overwrites body bytes at `at` (a header reserved before its contents were known).
    pub fn patch_body(&mut self, at: usize, bytes: &[u8]) {
        self.bytes[4 + at..4 + at + bytes.len()].copy_from_slice(bytes);
    }

    pub fn reserve(&mut self, additional: usize) {
        self.bytes.reserve(additional);
    }

    /// Mark and body, ready for the wire: one last fragment.
    pub fn into_frame(mut self) -> Vec<u8> {
        let mark = last_fragment_mark(self.body_len());
        self.bytes[..4].copy_from_slice(&mark);
        self.bytes
    }
}

/// Appending, so XDR encoders write straight into the reply.
impl Write for ReplyBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

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
    frames: Vec<Vec<u8>>,
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

impl<W: Write> ReplyWriter<W> {
    pub fn new(stream: W) -> Self {
        ReplyWriter {
            queue: Mutex::new(ReplyQueue::default()),
            stream: Mutex::new(stream),
            writes: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
        }
    }

    /// `write` calls made so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Relaxed)
    }

    pub fn bytes_out(&self) -> u64 {
        self.bytes_out.load(Relaxed)
    }

    /// Sends one framed reply (from [`ReplyBuf::into_frame`]), now or as part
    /// of the batch another thread is writing. An error means the connection
    /// can take no more replies.
    pub fn send(&self, frame: Vec<u8>) -> io::Result<()> {
        self.send_all(vec![frame])
    }

    /// Sends several framed replies, in one write when nothing else is queued.
    pub fn send_all(&self, mut frames: Vec<Vec<u8>>) -> io::Result<()> {
        if frames.is_empty() {
            return Ok(());
        }
        let mut queue = self.queue.lock().expect("reply queue poisoned");
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
            queue = self.queue.lock().expect("reply queue poisoned");
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

    fn write_batch(&self, frames: &[Vec<u8>]) -> io::Result<()> {
        let mut stream = self.stream.lock().expect("reply stream poisoned");
        let mut slices: Vec<IoSlice<'_>> = frames.iter().map(|f| IoSlice::new(f)).collect();
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            self.writes.fetch_add(1, Relaxed);
            match stream.write_vectored(slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.bytes_out.fetch_add(n as u64, Relaxed);
                    IoSlice::advance_slices(&mut slices, n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
