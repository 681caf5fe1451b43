//! A connection's two clocks: a record must be whole within
//! `record_deadline` of its first byte (a sender that stalls half way, or
//! trickles a byte a second, holds a thread otherwise: the slowloris
//! attack), and a connection with no call for `idle_timeout` and none in
//! flight is closed (knfsd's default is 6 minutes; clients reconnect).
//!
//! The socket gets a receive timeout of a quarter of the shorter limit, so
//! a blocked read wakes to look at the clocks; reads that return data cost
//! nothing more.

use std::cell::Cell;
use std::io::{self, ErrorKind, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::record::Receive;

/// The limits, from the server's configuration.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub record_deadline: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    /// How long one blocked read waits before looking at the clocks.
    fn tick(&self) -> Duration {
        (self.record_deadline.min(self.idle_timeout) / 4).max(Duration::from_millis(1))
    }
}

/// A connection's socket as its reader reads it, with the clocks.
pub struct Timed<'a> {
    stream: &'a TcpStream,
    limits: Limits,
    /// When the first byte of the record being read arrived.
    record_started: Cell<Option<Instant>>,
    last_record: Cell<Instant>,
    /// Whether calls of this connection are still running.
    busy: &'a dyn Fn() -> bool,
}

impl<'a> Timed<'a> {
    pub fn new(
        stream: &'a TcpStream,
        limits: Limits,
        busy: &'a dyn Fn() -> bool,
    ) -> io::Result<Self> {
        stream.set_read_timeout(Some(limits.tick()))?;
        Ok(Timed {
            stream,
            limits,
            record_started: Cell::new(None),
            last_record: Cell::new(Instant::now()),
            busy,
        })
    }

    /// The reader turns to the next record; `more` if bytes of it are
    /// buffered already.
    pub fn next_record(&self, more: bool) {
        let now = Instant::now();
        self.last_record.set(now);
        self.record_started.set(more.then_some(now));
    }

    /// When the first byte of the record read last arrived (or the reader
    /// turned to it, if it was buffered already): the clocks' own reading.
    pub fn record_began(&self) -> Option<Instant> {
        self.record_started.get()
    }

    /// Runs one read, retrying those the receive timeout ends while the
    /// clocks allow; an error once a limit is passed.
    fn read_with(&self, mut read: impl FnMut() -> io::Result<usize>) -> io::Result<usize> {
        loop {
            match read() {
                Ok(n) => {
                    if n > 0 && self.record_started.get().is_none() {
                        self.record_started.set(Some(Instant::now()));
                    }
                    self.check_record()?;
                    return Ok(n);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    self.check_record()?;
                    let idle = self.last_record.get().elapsed();
                    if self.record_started.get().is_none()
                        && idle > self.limits.idle_timeout
                        && !(self.busy)()
                    {
                        return Err(io::Error::new(
                            ErrorKind::TimedOut,
                            format!("idle for {idle:.0?}"),
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn check_record(&self) -> io::Result<()> {
        match self.record_started.get() {
            Some(at) if at.elapsed() > self.limits.record_deadline => Err(io::Error::new(
                ErrorKind::TimedOut,
                format!(
                    "a record not whole {:.0?} after its first byte",
                    self.limits.record_deadline
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let stream = self.stream;
        self.read_with(|| (&*stream).read(buf))
    }
}

impl Receive for Timed<'_> {
    fn receive_uninit(&mut self, buf: &mut Vec<u8>, want: usize) -> Option<io::Result<usize>> {
        let mut stream = self.stream;
        Some(self.read_with(|| {
            stream
                .receive_uninit(buf, want)
                .expect("a TcpStream reads into spare capacity")
        }))
    }
}
