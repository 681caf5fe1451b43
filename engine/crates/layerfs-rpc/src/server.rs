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
//!
//! Here: the configuration, the worker pool and starting and stopping.
//! `admission`: who may connect, and room for one more connection (the
//! idle one the longest is closed); `connection`: a connection's reader
//! loop and its replies; `window`: the calls in flight on a connection.

use parking_lot::Mutex;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use socket2::{Domain, Socket, Type};

use crate::program::{Dispatcher, Routed};

mod admission;
mod connection;
mod window;

use admission::accept_loop;
pub use admission::Admission;
use connection::Connection;

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

/// Counters of the transport, for one connection or summed over a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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

/// A call for a worker: its record, and the envelope decoded from it.
struct Job {
    conn: Arc<Connection>,
    routed: Routed,
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
                            job.conn.answer(&dispatcher, &job.routed, &job.record);
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
