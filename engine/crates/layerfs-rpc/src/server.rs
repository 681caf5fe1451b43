//! The TCP server: one reader thread per connection, a shared pool of worker
//! threads, and a bounded window of calls in flight per connection.
//!
//! The reader frames records. Quick calls, and brief ones while the
//! connection has nothing else to do (see [`crate::Placement`]), run on the
//! reader itself and their replies are sent together once no further record
//! is buffered; every other call goes to the pool. Replies leave
//! in whatever order calls finish (the xid pairs them). When a connection has
//! `window` calls in flight its reader stops reading until one finishes, so a
//! client that pipelines without limit holds at most `window` records in
//! server memory and the rest waits in its own socket buffer.

use parking_lot::{Condvar, Mutex};
use std::io::{self, ErrorKind};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{
    AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use socket2::{Domain, SockRef, Socket, Type};

use crate::program::{Dispatcher, Outcome, Placement};
use crate::record::Records;
use crate::reply::{Frame, ReplyWriter};
use crate::timeouts::{Limits, Timed};

/// Tuning of the server; the defaults suit a loopback mount.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Calls in flight per connection before its reader pauses.
    pub window: usize,
    /// Threads running calls, shared by all connections.
    pub workers: usize,
    /// Who may connect.
    pub admit: Admission,
    /// A record not whole this long after its first byte closes its
    /// connection (a stalled or trickling sender).
    pub record_deadline: Duration,
    /// A connection without a call for this long, and none running, is closed.
    pub idle_timeout: Duration,
    /// Connections open at most (a thread each). A new one past it closes
    /// the connection idle the longest, as knfsd does, or is refused if
    /// every one has calls running.
    pub max_connections: usize,
    /// How long a CPU is kept awake after replies leave for a client that
    /// was waiting for them, for its next call (see the `awake` module);
    /// zero keeps none awake.
    pub stay_awake: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            window: 64,
            workers: 16,
            admit: Admission::Anyone,
            record_deadline: Duration::from_secs(30),
            // knfsd's: the Linux client reconnects when it needs to.
            idle_timeout: Duration::from_secs(6 * 60),
            max_connections: 1024,
            stay_awake: Duration::from_micros(200),
        }
    }
}

/// Who may connect over loopback, decided at accept, before a byte is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Anyone,
    /// Only sockets owned by one of these uids (the kernel's NFS client's
    /// are root's), as the kernel records them ([`crate::peer::owner`]). A
    /// connection whose owner cannot be found is refused; one from another
    /// host is not checked (no local uid owns it). Where the platform cannot
    /// tell owners (not Linux or macOS, or a macOS whose socket table reads
    /// otherwise than expected), everyone is let in.
    Uids(Vec<u32>),
}

impl Admission {
    /// Whether the connection from `peer` to our `local` may stay open.
    fn admits(&self, local: SocketAddr, peer: SocketAddr) -> bool {
        let Admission::Uids(uids) = self else {
            return true;
        };
        if !peer.ip().is_loopback() {
            return true;
        }
        match crate::peer::owner(local, peer) {
            Ok(Some(uid)) if uids.contains(&uid) => true,
            Ok(Some(uid)) => {
                tracing::warn!(%peer, uid, "refused a connection from a local user not allowed in");
                false
            }
            Ok(None) => true,
            Err(e) => {
                tracing::warn!(%peer, "refused a connection whose owner is unknown: {e}");
                false
            }
        }
    }
}

/// Counters of the transport, for one connection or summed over a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    pub connections: u64,
    pub records: u64,
    pub socket_reads: u64,
    pub replies: u64,
    pub socket_writes: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl TransportStats {
    fn add(&mut self, other: &TransportStats) {
        self.connections += other.connections;
        self.records += other.records;
        self.socket_reads += other.socket_reads;
        self.replies += other.replies;
        self.socket_writes += other.socket_writes;
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
    }
}

/// Calls in flight on one connection, at most `size`.
///
/// A slot is held from the call's hand-off until its reply is sent, so a
/// client that reads no replies stops the reader; the call counts as
/// running only until its reply is made, so a client that sends its next
/// call on reading the reply finds the connection idle.
struct Window {
    in_flight: Mutex<usize>,
    freed: Condvar,
    size: usize,
    running: AtomicU64,
}

impl Window {
    fn new(size: usize) -> Self {
        Window {
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
            size: size.max(1),
            running: AtomicU64::new(0),
        }
    }

    fn try_acquire(&self) -> bool {
        let mut n = self.in_flight.lock();
        let free = *n < self.size;
        if free {
            *n += 1;
            self.running.fetch_add(1, Relaxed);
        }
        free
    }

    fn acquire(&self) {
        let mut n = self.in_flight.lock();
        while *n >= self.size {
            self.freed.wait(&mut n);
        }
        *n += 1;
        self.running.fetch_add(1, Relaxed);
    }

    /// The call's reply is made (or it has none): it no longer runs.
    fn answered(&self) {
        self.running.fetch_sub(1, Release);
    }

    /// The call's reply is sent: its slot is free.
    fn release(&self) {
        *self.in_flight.lock() -= 1;
        self.freed.notify_all();
    }

    fn is_busy(&self) -> bool {
        *self.in_flight.lock() > 0
    }

    /// Whether a call handed off is still running, its reply not yet made.
    fn is_running(&self) -> bool {
        self.running.load(Acquire) > 0
    }

    /// Waits until every call in flight has finished.
    fn drain(&self) {
        let mut n = self.in_flight.lock();
        while *n > 0 {
            self.freed.wait(&mut n);
        }
    }
}

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

struct Connection {
    /// The client's address without the port, as programs see it.
    peer: Option<IpAddr>,
    addr: SocketAddr,
    /// The socket its reader reads; shut down to end the connection.
    stream: TcpStream,
    writer: ReplyWriter<TcpStream>,
    window: Window,
    /// When its last call arrived, in milliseconds since the server started.
    last_call: AtomicU64,
    /// Chosen to make room for a new connection; going.
    evicted: AtomicBool,
    stay_awake: Duration,
    records: AtomicU64,
    socket_reads: AtomicU64,
    bytes_in: AtomicU64,
    replies: AtomicU64,
}

impl Connection {
    fn stats(&self) -> TransportStats {
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
    fn answer(&self, dispatcher: &Dispatcher, record: &[u8]) {
        let outcome = dispatcher.handle(record, self.peer);
        self.window.answered();
        let mut waiting = false;
        let call_back = matches!(outcome, Outcome::ReplyThen(_));
        if let Outcome::Reply(frame) | Outcome::ReplyThen(frame) = outcome {
            waiting = self.client_waits(record.len().max(frame.len()));
            self.send_replies(vec![frame]);
        }
        self.window.release();
        if call_back {
            dispatcher.after_reply(record, self.peer);
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
    fn client_waits(&self, largest: usize) -> bool {
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
    fn expect_next_call(&self) {
        if !self.window.is_busy() {
            crate::awake::keep_awake(self.stay_awake, || client_cpu(&self.stream));
        }
    }

    fn send_replies(&self, frames: Vec<Frame>) {
        let n = frames.len() as u64;
        match self.writer.send_all(frames) {
            Ok(()) => {
                self.replies.fetch_add(n, Relaxed);
            }
            Err(e) => tracing::debug!(peer = ?self.peer, "replies not sent: {e}"),
        }
    }

    fn note_reads<R: crate::record::Receive>(&self, records: &Records<R>) {
        self.socket_reads.store(records.reads(), Relaxed);
        self.bytes_in.store(records.bytes_in(), Relaxed);
    }
}

struct Job {
    conn: Arc<Connection>,
    record: Vec<u8>,
}

/// State shared by the accept loop, the readers and the workers.
struct Shared {
    dispatcher: Arc<Dispatcher>,
    config: ServerConfig,
    /// Each reader sends calls for the workers through its own clone; the
    /// workers end once this one and every clone are gone.
    jobs: Mutex<Option<Sender<Job>>>,
    live: Mutex<Vec<Weak<Connection>>>,
    /// The reader threads, joined by [`ServerHandle::stop`].
    readers: Mutex<Vec<JoinHandle<()>>>,
    started: Instant,
    closed: Mutex<TransportStats>,
    stopping: AtomicBool,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// `at`, in milliseconds since the server started.
    fn ms_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_millis() as u64
    }

    /// Whether a new connection from `peer` may open: below the limit, or
    /// once the connection idle the longest is on its way out.
    fn make_room(&self, peer: SocketAddr) -> bool {
        let live: Vec<Arc<Connection>> = self
            .live
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| !c.evicted.load(Relaxed))
            .collect();
        if live.len() < self.config.max_connections {
            return true;
        }
        let idle = live
            .iter()
            .filter(|c| !c.window.is_busy())
            .min_by_key(|c| c.last_call.load(Relaxed));
        match idle {
            Some(oldest) => {
                tracing::info!(
                    closed = %oldest.addr, %peer,
                    "{} connections open: closing the one idle the longest", live.len()
                );
                oldest.evicted.store(true, Relaxed);
                // Its reader sees the end of the stream and winds it down.
                let _ = oldest.stream.shutdown(Shutdown::Read);
                true
            }
            None => {
                tracing::warn!(%peer, "{} connections open, all busy: refused", live.len());
                false
            }
        }
    }

    fn stats(&self) -> TransportStats {
        let mut live = self.live.lock();
        let mut total = *self.closed.lock();
        live.retain(|weak| match weak.upgrade() {
            Some(conn) => {
                total.add(&conn.stats());
                true
            }
            None => false,
        });
        total
    }
}

/// A bound, not yet serving, RPC server.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
    job_queue: Receiver<Job>,
}

impl Server {
    /// Binds `addr` (port 0 lets the OS pick) with a backlog suited to bursts
    /// of reconnects.
    pub fn bind(
        addr: SocketAddr,
        dispatcher: Arc<Dispatcher>,
        config: ServerConfig,
    ) -> io::Result<Self> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        let (jobs, job_queue) = crossbeam_channel::unbounded();
        Ok(Server {
            listener: socket.into(),
            shared: Arc::new(Shared {
                dispatcher,
                config,
                jobs: Mutex::new(Some(jobs)),
                live: Mutex::new(Vec::new()),
                readers: Mutex::new(Vec::new()),
                started: Instant::now(),
                closed: Mutex::new(TransportStats::default()),
                stopping: AtomicBool::new(false),
            }),
            job_queue,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Starts the workers and the accept loop on threads of their own.
    pub fn spawn(self) -> io::Result<ServerHandle> {
        let addr = self.local_addr()?;
        let mut workers = Vec::new();
        for i in 0..self.shared.config.workers.max(1) {
            let queue = self.job_queue.clone();
            let dispatcher = self.shared.dispatcher.clone();
            workers.push(
                thread::Builder::new()
                    .name(format!("rpc-worker-{i}"))
                    .spawn(move || {
                        for job in queue {
                            job.conn.answer(&dispatcher, &job.record);
                            crate::record::release(job.record);
                        }
                    })?,
            );
        }
        let shared = self.shared.clone();
        let listener = self.listener;
        let accept = thread::Builder::new()
            .name("rpc-accept".into())
            .spawn(move || accept_loop(&listener, &shared))?;
        Ok(ServerHandle {
            addr,
            shared: self.shared,
            accept: Some(accept),
            workers,
        })
    }
}

/// A running server.
pub struct ServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Transport counters summed over every connection, open or closed.
    pub fn stats(&self) -> TransportStats {
        self.shared.stats()
    }

    /// Each open connection's client address and counters.
    pub fn connections(&self) -> Vec<(SocketAddr, TransportStats)> {
        let live = self.shared.live.lock();
        live.iter()
            .filter_map(Weak::upgrade)
            .map(|c| (c.addr, c.stats()))
            .collect()
    }

    pub fn dispatcher(&self) -> &Dispatcher {
        &self.shared.dispatcher
    }

    /// Stops the server: no new connections, every open one closed once
    /// the calls it already read are answered, and every thread ended.
    /// Returns when all are gone.
    pub fn stop(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.shared.stopping.store(true, Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        let _ = accept.join();
        // No reader starts after this; the workers end with the last reader.
        drop(self.shared.jobs.lock().take());
        let live: Vec<_> = self.shared.live.lock().clone();
        for conn in live.iter().filter_map(Weak::upgrade) {
            // Its reader sees the end of the stream and winds it down.
            let _ = conn.stream.shutdown(Shutdown::Read);
        }
        let readers = std::mem::take(&mut *self.shared.readers.lock());
        for reader in readers {
            let _ = reader.join();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Relaxed) {
            return;
        }
        match accepted {
            Ok((stream, peer)) => {
                let admitted = stream
                    .local_addr()
                    .is_ok_and(|local| shared.config.admit.admits(local, peer));
                if !admitted || !shared.make_room(peer) {
                    // Closed before a byte of it is read.
                    continue;
                }
                let for_reader = shared.clone();
                let spawned = thread::Builder::new()
                    .name(format!("rpc-conn-{peer}"))
                    .spawn(move || serve_connection(stream, peer, &for_reader));
                match spawned {
                    Ok(reader) => {
                        let mut readers = shared.readers.lock();
                        readers.retain(|r| !r.is_finished());
                        readers.push(reader);
                    }
                    Err(e) => tracing::error!(%peer, "cannot start a connection thread: {e}"),
                }
            }
            Err(e) => {
                // Out of descriptors or a connection reset before accept: keep
                // listening, but do not spin while the cause persists.
                tracing::warn!("accept failed: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
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

fn serve_connection(stream: TcpStream, peer: SocketAddr, shared: &Shared) {
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
        let on_reader = match dispatcher.placement(record.as_bytes()) {
            Placement::Reader => true,
            Placement::ReaderWhenIdle => rest == 0 && !conn.window.is_running(),
            Placement::Worker => false,
        };
        let for_worker = if on_reader {
            let call = record.as_bytes();
            let outcome = dispatcher.handle(call, conn.peer);
            let call_back = matches!(outcome, Outcome::ReplyThen(_));
            if let Outcome::Reply(frame) | Outcome::ReplyThen(frame) = outcome {
                largest = largest.max(call.len()).max(frame.len());
                ready.push(frame);
            }
            if call_back {
                // Its reply leaves first, while the record is still at hand.
                flush(&mut ready, &mut largest, rest);
                dispatcher.after_reply(call, conn.peer);
            }
            record.release();
            None
        } else {
            Some(record.into_vec())
        };
        conn.note_reads(&records);
        // When its first byte came, from the clock read then.
        let arrived = records
            .get_ref()
            .record_began()
            .unwrap_or_else(Instant::now);
        conn.last_call.store(shared.ms_at(arrived), Relaxed);
        let Some(record) = for_worker else { continue };
        if !conn.window.try_acquire() {
            conn.send_replies(std::mem::take(&mut ready));
            conn.window.acquire();
        }
        let job = Job {
            conn: conn.clone(),
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
