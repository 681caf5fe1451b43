//! Record marking (RFC 5531 §11): framing RPC messages on a byte stream.
//!
//! Buffer policy, in one place: each connection owns one read-ahead buffer of
//! [`READ_AHEAD`] bytes, allocated when the connection starts and never grown.
//! Every `read` asks for as much as fits in it. A record whose single fragment
//! fits (`4 + len <= READ_AHEAD`) is framed in place, so a call that arrived in
//! one piece costs one `read`, and records that arrived together cost one `read`
//! between them. Any other record (a large WRITE, a fragment chain) is assembled
//! in a buffer of its own: the bytes already buffered are its prefix and the rest
//! is read straight into it, so its payload is copied once (from a socket,
//! into the buffer's uninitialised capacity: no zeroing pass first). A record
//! of 64 KiB or more takes a buffer a finished large
//! call or reply left, and [`Record::release`] gives it back (`spares.rs`:
//! fresh pages cost a fault each). Bytes past the end of a record always stay
//! buffered for the next one.
//!
//! Limits are checked before allocating: a fragment, and the running sum of a
//! chain, may not exceed [`RECORD_LIMIT`].

use std::io::{self, ErrorKind, Read};

use crate::spares::{LARGE, SPARES};

/// Size of the per-connection read-ahead buffer.
pub const READ_AHEAD: usize = 8192;

/// Largest record accepted, per fragment and for the sum of a fragment chain.
/// A 1 MiB WRITE plus its header fits with room to spare.
pub const RECORD_LIMIT: usize = 2 * 1024 * 1024;

const MARK_LEN: usize = 4;
const LAST_FRAGMENT: u32 = 0x8000_0000;

/// One complete RPC message.
#[derive(Debug)]
pub enum Record<'a> {
    /// Framed in place from the read-ahead buffer.
    Buffered(&'a [u8]),
    /// Assembled in a buffer of its own (a large record or a fragment chain).
    Owned(Vec<u8>),
}

impl Record<'_> {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Record::Buffered(bytes) => bytes,
            Record::Owned(bytes) => bytes,
        }
    }

    /// The record as an owned buffer; copies only a buffered record.
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Record::Buffered(bytes) => bytes.to_vec(),
            Record::Owned(bytes) => bytes,
        }
    }

    /// Done with the record: a large buffer of its own is kept for the
    /// next large record or reply.
    pub fn release(self) {
        if let Record::Owned(bytes) = self {
            release(bytes);
        }
    }
}

/// Done with a record's bytes (see [`Record::release`]).
pub fn release(bytes: Vec<u8>) {
    SPARES.give_back(bytes);
}

/// An empty buffer with room for a record of `len` bytes.
fn buffer_for(len: usize) -> Vec<u8> {
    let kept = (len >= LARGE).then(|| SPARES.take(len)).flatten();
    kept.unwrap_or_else(|| Vec::with_capacity(len))
}

/// Reads records from a byte stream; see the module documentation.
pub struct Records<R> {
    stream: R,
    buf: Box<[u8]>,
    /// `buf[start..end]` holds bytes read but not yet consumed.
    start: usize,
    end: usize,
    reads: u64,
    bytes_in: u64,
}

/// A stream records are read from.
pub trait Receive: Read {
    /// One read of up to `want` bytes into `buf`'s spare capacity (which
    /// holds at least that many), without zeroing it first, appended to
    /// `buf`; `None` where this stream cannot (`Read` needs initialised
    /// memory). Never more than `want`: the bytes after are the next record's.
    fn receive_uninit(&mut self, buf: &mut Vec<u8>, want: usize) -> Option<io::Result<usize>> {
        let _ = (buf, want);
        None
    }
}

impl Receive for &std::net::TcpStream {
    #[allow(unsafe_code)]
    fn receive_uninit(&mut self, buf: &mut Vec<u8>, want: usize) -> Option<io::Result<usize>> {
        let len = buf.len();
        let n = match rustix::io::read(*self, &mut buf.spare_capacity_mut()[..want]) {
            Ok((filled, _)) => filled.len(),
            Err(e) => return Some(Err(e.into())),
        };
        // SAFETY: `read` initialised the first `n` bytes of the spare
        // capacity, the ones right after `len`.
        unsafe { buf.set_len(len + n) };
        Some(Ok(n))
    }
}

impl Receive for std::net::TcpStream {
    fn receive_uninit(&mut self, buf: &mut Vec<u8>, want: usize) -> Option<io::Result<usize>> {
        (&*self).receive_uninit(buf, want)
    }
}

impl<R: Receive> Records<R> {
    pub fn new(stream: R) -> Self {
        Records {
            stream,
            buf: vec![0; READ_AHEAD].into_boxed_slice(),
            start: 0,
            end: 0,
            reads: 0,
            bytes_in: 0,
        }
    }

    /// `read` calls made on the stream so far (each restart after EINTR counts).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Bytes received from the stream so far.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in
    }

    /// Bytes read ahead and not yet part of a returned record.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Whether a whole single-fragment record is buffered, so the next
    /// [`next_record`](Self::next_record) returns without reading.
    pub fn has_buffered_record(&self) -> bool {
        let pending = &self.buf[self.start..self.end];
        let Some(mark) = pending.get(..MARK_LEN) else {
            return false;
        };
        let mark = u32::from_be_bytes(mark.try_into().expect("4 bytes"));
        let len = (mark & !LAST_FRAGMENT) as usize;
        mark & LAST_FRAGMENT != 0 && pending.len() >= MARK_LEN + len
    }

    pub fn get_ref(&self) -> &R {
        &self.stream
    }

    /// The next record; `Ok(None)` when the stream ends cleanly between records.
    ///
    /// Errors: `InvalidData` for a record past [`RECORD_LIMIT`] (nothing is
    /// allocated for it), `UnexpectedEof` for a stream that ends inside a record,
    /// and any error of the stream other than `Interrupted`. After an error the
    /// stream is out of step and the connection must be closed.
    pub fn next_record(&mut self) -> io::Result<Option<Record<'_>>> {
        Ok(self.next_record_and_rest()?.map(|(record, _)| record))
    }

    /// The next record, as [`next_record`](Self::next_record), and how many
    /// bytes already read follow it: none means the peer has sent nothing
    /// more yet, as far as this reader knows.
    pub fn next_record_and_rest(&mut self) -> io::Result<Option<(Record<'_>, usize)>> {
        let Some((len, last)) = self.next_mark(true)? else {
            return Ok(None);
        };
        if last && MARK_LEN + len <= READ_AHEAD {
            self.fill_to(len)?;
            let body = self.start..self.start + len;
            self.consume(len);
            let rest = self.buffered();
            return Ok(Some((Record::Buffered(&self.buf[body]), rest)));
        }
        let mut record = buffer_for(len);
        self.append_fragment(&mut record, len)?;
        let mut last = last;
        while !last {
            let (len, is_last) = self.next_mark(false)?.expect("mark inside a record");
            check_limit(record.len() + len)?;
            record.reserve_exact(len);
            self.append_fragment(&mut record, len)?;
            last = is_last;
        }
        Ok(Some((Record::Owned(record), self.buffered())))
    }

    /// Consumes the next fragment mark, reading if fewer than four bytes are
    /// buffered. `Ok(None)` only when `at_boundary` and the stream ends there.
    fn next_mark(&mut self, at_boundary: bool) -> io::Result<Option<(usize, bool)>> {
        if at_boundary && self.buffered() == 0 && self.read_more()? == 0 {
            return Ok(None);
        }
        self.fill_to(MARK_LEN)?;
        let at = self.start;
        let mark = u32::from_be_bytes(self.buf[at..at + MARK_LEN].try_into().expect("4 bytes"));
        self.consume(MARK_LEN);
        let len = (mark & !LAST_FRAGMENT) as usize;
        check_limit(len)?;
        Ok(Some((len, mark & LAST_FRAGMENT != 0)))
    }

    /// Appends a fragment body of `len` bytes: buffered bytes first, then one
    /// exact read straight into `record` for the rest.
    fn append_fragment(&mut self, record: &mut Vec<u8>, len: usize) -> io::Result<()> {
        let from_buf = len.min(self.buffered());
        record.extend_from_slice(&self.buf[self.start..self.start + from_buf]);
        self.consume(from_buf);
        let end = record.len() + (len - from_buf);
        while record.len() < end {
            let n = loop {
                let Some(result) = self.stream.receive_uninit(record, end - record.len()) else {
                    break None;
                };
                self.reads += 1;
                match result {
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    result => break Some(result?),
                }
            };
            match n {
                None => break,
                Some(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Some(n) => self.bytes_in += n as u64,
            }
        }
        let mut at = record.len();
        record.resize(end, 0);
        while at < end {
            match read_restarting(&mut self.stream, &mut record[at..], &mut self.reads)? {
                0 => return Err(ErrorKind::UnexpectedEof.into()),
                n => {
                    at += n;
                    self.bytes_in += n as u64;
                }
            }
        }
        Ok(())
    }

    /// Makes at least `want` bytes (`want <= READ_AHEAD`) buffered, moving the
    /// buffered tail to the front first if it would not fit behind it.
    fn fill_to(&mut self, want: usize) -> io::Result<()> {
        if self.start + want > READ_AHEAD {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        while self.buffered() < want {
            if self.read_more()? == 0 {
                return Err(ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    /// One `read` into the free tail of the read-ahead buffer.
    fn read_more(&mut self) -> io::Result<usize> {
        let Records {
            stream, buf, end, ..
        } = self;
        let n = read_restarting(stream, &mut buf[*end..], &mut self.reads)?;
        self.end += n;
        self.bytes_in += n as u64;
        Ok(n)
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }
}

/// One `read`, restarted only when a signal interrupted it.
fn read_restarting<R: Read>(stream: &mut R, dst: &mut [u8], reads: &mut u64) -> io::Result<usize> {
    loop {
        *reads += 1;
        match stream.read(dst) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            result => return result,
        }
    }
}

fn check_limit(len: usize) -> io::Result<()> {
    if len > RECORD_LIMIT {
        return Err(io::Error::new(
            ErrorKind::InvalidData,
            format!("RPC record of {len} bytes exceeds the {RECORD_LIMIT}-byte limit"),
        ));
    }
    Ok(())
}

/// The 4-byte mark of a reply sent as one last fragment of `len` bytes.
pub fn last_fragment_mark(len: usize) -> [u8; 4] {
    assert!(
        len < LAST_FRAGMENT as usize,
        "reply larger than one fragment"
    );
    (LAST_FRAGMENT | len as u32).to_be_bytes()
}
