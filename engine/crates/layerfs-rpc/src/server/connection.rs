//! One connection: its reader frames records and runs quick calls itself or
//! hands them to the workers, within its window; its replies leave
//! together once nothing more is buffered.

use std::io::{self, ErrorKind};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::SockRef;

use super::window::Window;
use super::{Job, Shared, TransportStats};
use crate::program::{Dispatcher, Outcome, Placement, Routed};
use crate::record::Records;
use crate::reply::{Frame, ReplyWriter};
use crate::timeouts::{Limits, Timed};

/// A call or reply this large takes longer to cross the socket than a halted
/// CPU takes to wake, so no CPU is kept awake after it: spinning while the
/// next 1 MiB WRITE arrived cost 200 us of CPU per call and some of its rate,
/// where a listing's reply of about 160 KiB still answered twice as fast
/// with a CPU kept awake (docs/benchmarks.md).
const LONG_EXCHANGE: usize = 256 * 1024;

/// The CPU the socket's last bytes were received on: on loopback, the one
/// the client sent them from.
#[cfg(target_os = "linux")]
fn client_cpu(stream: &TcpStream) -> Option<usize> {
    let cpu = rustix::net::sockopt::socket_incoming_cpu(stream).ok()?;
    usize::try_from(cpu).ok()
}

#[cfg(not(target_os = "linux"))]
fn client_cpu(_stream: &TcpStream) -> Option<usize> {
    None
}

pub(super) struct Connection {
    /// The client's address without the port, as programs see it.
    pub(super) peer: Option<IpAddr>,
    pub(super) addr: SocketAddr,
    /// The socket its reader reads; shut down to end the connection.
    pub(super) stream: TcpStream,
    pub(super) writer: ReplyWriter<TcpStream>,
    pub(super) window: Window,
    /// When its last call arrived, in milliseconds since the server started.
    pub(super) last_call: AtomicU64,
    /// Chosen to make room for a new connection; going.
    pub(super) evicted: AtomicBool,
    pub(super) stay_awake: Duration,
    pub(super) records: AtomicU64,
    pub(super) socket_reads: AtomicU64,
    pub(super) bytes_in: AtomicU64,
    pub(super) replies: AtomicU64,
}

impl Connection {
    pub(super) fn stats(&self) -> TransportStats {
        TransportStats {
            connections: 1,
            records: self.records.load(Relaxed),
            socket_reads: self.socket_reads.load(Relaxed),
            replies: self.replies.load(Relaxed),
            socket_writes: self.writer.writes(),
            bytes_in: self.bytes_in.load(Relaxed),
            bytes_out: self.writer.bytes_out(),
        }
    }

    /// Runs one call on a worker and sends its reply; releases its window slot.
    pub(super) fn answer(&self, dispatcher: &Dispatcher, routed: &Routed, record: &[u8]) {
        let outcome = dispatcher.answer(routed, record, self.peer);
        self.window.answered();
        let mut waiting = false;
        let call_back = matches!(outcome, Outcome::ReplyThen(_));
        if let Outcome::Reply(frame) | Outcome::ReplyThen(frame) = outcome {
            waiting = self.client_waits(record.len().max(frame.len()));
            self.send_replies(vec![frame]);
        }
        self.window.release();
        if call_back {
            dispatcher.after_reply(routed, record, self.peer);
        }
        if waiting {
            self.expect_next_call();
        }
    }

    /// Whether the client is waiting for the replies about to leave, before
    /// it sends its next call: it has sent nothing since, no other call
    /// runs, and no call or reply is [`LONG_EXCHANGE`] or more. Asked before
    /// the replies leave: afterwards a quick client's next call may already
    /// be queued, and queued bytes would no longer tell a waiting client from
    /// a pipelining one. One `FIONREAD`, and only when keeping a CPU awake
    /// is on.
    pub(super) fn client_waits(&self, largest: usize) -> bool {
        !self.stay_awake.is_zero()
            && largest < LONG_EXCHANGE
            && !self.window.is_running()
            && rustix::io::ioctl_fionread(&self.stream).is_ok_and(|queued| queued == 0)
    }

    /// Replies have left for a client that was waiting for them, and nothing
    /// else is in flight: its next call is likely to follow at once, so keep
    /// a CPU awake for it. A client that pipelines its calls keeps the CPUs
    /// busy anyway, and spinning there cost WRITE 32 KiB at depth 16 a third
    /// of its rate (docs/benchmarks.md).
    pub(super) fn expect_next_call(&self) {
        if !self.window.is_busy() {
            crate::awake::keep_awake(self.stay_awake, || client_cpu(&self.stream));
        }
    }

    pub(super) fn send_replies(&self, frames: Vec<Frame>) {
        let n = frames.len() as u64;
        match self.writer.send_all(frames) {
            Ok(()) => {
                self.replies.fetch_add(n, Relaxed);
            }
            Err(e) => tracing::debug!(peer = ?self.peer, "replies not sent: {e}"),
        }
    }

    pub(super) fn note_reads<R: crate::record::Receive>(&self, records: &Records<R>) {
        self.socket_reads.store(records.reads(), Relaxed);
        self.bytes_in.store(records.bytes_in(), Relaxed);
    }
}

/// Socket options of an accepted connection. Best effort: on some systems a
/// connection the peer already reset refuses options, and a missing option
/// costs latency, never correctness, so failures are logged and ignored.
fn configure_accepted(stream: &TcpStream, peer: SocketAddr) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(%peer, "TCP_NODELAY not set: {e}");
    }
    if let Err(e) = SockRef::from(stream).set_keepalive(true) {
        tracing::warn!(%peer, "SO_KEEPALIVE not set: {e}");
    }
}

pub(super) fn serve_connection(stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    configure_accepted(&stream, peer);
    let Some(jobs) = shared.jobs.lock().clone() else {
        return; // the server is stopping
    };
    let write_half = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, "cannot clone the socket: {e}");
            return;
        }
    };
    let conn = Arc::new(Connection {
        peer: Some(peer.ip()),
        addr: peer,
        stream,
        writer: ReplyWriter::new(write_half),
        window: Window::new(shared.config.window),
        last_call: AtomicU64::new(shared.now_ms()),
        evicted: AtomicBool::new(false),
        stay_awake: shared.config.stay_awake,
        records: AtomicU64::new(0),
        socket_reads: AtomicU64::new(0),
        bytes_in: AtomicU64::new(0),
        replies: AtomicU64::new(0),
    });
    shared.live.lock().push(Arc::downgrade(&conn));
    tracing::debug!(%peer, "connection open");

    let limits = Limits {
        record_deadline: shared.config.record_deadline,
        idle_timeout: shared.config.idle_timeout,
    };
    let busy = || conn.window.is_busy();
    let timed = match Timed::new(&conn.stream, limits, &busy) {
        Ok(timed) => timed,
        Err(e) => {
            tracing::warn!(%peer, "cannot set the socket's receive timeout: {e}");
            return;
        }
    };
    let mut records = Records::new(timed);
    // Replies of calls run on this thread, sent together before it next blocks.
    let mut ready = Vec::new();
    // The largest call or reply among them.
    let mut largest = 0;
    let dispatcher = &shared.dispatcher;
    // Sends the replies ready, and keeps a CPU awake if the client waits.
    let flush = |ready: &mut Vec<Frame>, largest: &mut usize, buffered: usize| {
        let waiting = buffered == 0 && conn.client_waits(*largest);
        *largest = 0;
        conn.send_replies(std::mem::take(ready));
        if waiting {
            conn.expect_next_call();
        }
    };
    let end = loop {
        if !records.has_buffered_record() && !ready.is_empty() {
            flush(&mut ready, &mut largest, records.buffered());
        }
        // The clocks start now, not while the reader waited for the window.
        records.get_ref().next_record(records.buffered() > 0);
        let (record, rest) = match records.next_record_and_rest() {
            Ok(Some(read)) => read,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        conn.records.fetch_add(1, Relaxed);
        let routed = dispatcher.route(record.as_bytes());
        let on_reader = match routed.placement() {
            Placement::Reader => true,
            Placement::ReaderWhenIdle => rest == 0 && !conn.window.is_running(),
            Placement::Worker => false,
        };
        let for_worker = if on_reader {
            let call = record.as_bytes();
            let outcome = dispatcher.answer(&routed, call, conn.peer);
            let call_back = matches!(outcome, Outcome::ReplyThen(_));
            if let Outcome::Reply(frame) | Outcome::ReplyThen(frame) = outcome {
                largest = largest.max(call.len()).max(frame.len());
                ready.push(frame);
            }
            if call_back {
                // Its reply leaves first, while the record is still at hand.
                flush(&mut ready, &mut largest, rest);
                dispatcher.after_reply(&routed, call, conn.peer);
            }
            record.release();
            None
        } else {
            Some((routed, record.into_vec()))
        };
        conn.note_reads(&records);
        // When its first byte came, from the clock read then.
        let arrived = records
            .get_ref()
            .record_began()
            .unwrap_or_else(Instant::now);
        conn.last_call.store(shared.ms_at(arrived), Relaxed);
        let Some((routed, record)) = for_worker else {
            continue;
        };
        if !conn.window.try_acquire() {
            conn.send_replies(std::mem::take(&mut ready));
            conn.window.acquire();
        }
        let job = Job {
            conn: conn.clone(),
            routed,
            record,
        };
        if let Err(lost) = jobs.send(job) {
            let window = &lost.into_inner().conn.window;
            window.answered();
            window.release();
            break Err(io::Error::other("worker pool is gone"));
        }
    };
    conn.note_reads(&records);
    conn.send_replies(ready);
    match end {
        Ok(()) => tracing::debug!(%peer, "connection closed by the client"),
        Err(e) if e.kind() == ErrorKind::InvalidData => {
            tracing::warn!(%peer, "closing the connection: {e}")
        }
        Err(e) if e.kind() == ErrorKind::TimedOut => {
            tracing::info!(%peer, "closing the connection: {e}")
        }
        Err(e) => tracing::debug!(%peer, "closing the connection: {e}"),
    }
    // Calls already read still get their replies unless the stream is broken.
    conn.window.drain();
    let _ = conn.stream.shutdown(Shutdown::Both);
    // Move its counters from the live list to the closed total in one step.
    let mut live = shared.live.lock();
    live.retain(|weak| !std::ptr::eq(weak.as_ptr(), Arc::as_ptr(&conn)));
    shared.closed.lock().add(&conn.stats());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn an_accepted_socket_has_nodelay_and_keepalive() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        assert!(
            !accepted.nodelay().unwrap(),
            "off by default, so the check below means something"
        );
        configure_accepted(&accepted, peer);
        assert!(accepted.nodelay().unwrap());
        assert!(SockRef::from(&accepted).keepalive().unwrap());
    }
}
