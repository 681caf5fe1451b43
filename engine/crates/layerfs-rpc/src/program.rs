//! RPC programs and the dispatcher that routes a record to one of them.
//!
//! A record's envelope is decoded once, by [`Dispatcher::route`]; the
//! [`Routed`] it gives is what the later steps of the call's life read: which
//! thread runs it ([`Dispatcher::placement`]), the call itself
//! ([`Dispatcher::answer`]) and the work left for after its reply
//! ([`Dispatcher::after_reply`]). [`Dispatcher::handle`] is the whole life
//! of a call without the socket: bytes of one record in, the framed reply
//! (or nothing) out.

use std::net::IpAddr;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::envelope::{self, Accepted, CallHeader, Credentials, Envelope};
use crate::latency::{quantile, Latency};
use crate::reply::{Frame, ReplyBuf};

/// One call as a program sees it.
#[derive(Debug)]
pub struct Call<'a> {
    pub xid: u32,
    pub vers: u32,
    pub proc: u32,
    pub cred: &'a Credentials,
    /// The procedure's XDR-encoded arguments.
    pub args: &'a [u8],
    /// The client's address, without the port.
    pub peer: Option<IpAddr>,
}

impl<'a> Call<'a> {
    fn of(header: &'a CallHeader, record: &'a [u8], peer: Option<IpAddr>) -> Self {
        Call {
            xid: header.xid,
            vers: header.vers,
            proc: header.proc,
            cred: &header.cred,
            args: &record[header.args_at..],
            peer,
        }
    }
}

/// Why a program answered a call without results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    ProcUnavail,
    GarbageArgs,
    SystemErr,
    /// No reply at all, as for a retransmission of a call still running:
    /// the client retransmits again later.
    Dropped,
    /// Denied AUTH_TOOWEAK: the call needs a credential that names a caller.
    AuthTooWeak,
}

/// An RPC program (such as NFS or MOUNT) served over this transport.
pub trait Program: Send + Sync {
    /// The program number, e.g. 100003 for NFS.
    fn number(&self) -> u32;
    /// Lowest and highest version served.
    fn versions(&self) -> (u32, u32);
    /// The procedure's name for logs and counters; `None` if it does not exist.
    fn procedure_name(&self, proc: u32) -> Option<&'static str>;
    /// Which thread runs `call`, a call whose version is within
    /// `versions()`. Asked on the connection's reader before the call runs;
    /// `call.peer` is not set.
    fn placement(&self, call: &Call<'_>) -> Placement {
        if call.proc == 0 {
            Placement::Reader
        } else {
            Placement::Worker
        }
    }
    /// Runs a call whose version is within `versions()`, appending the
    /// procedure's results to `reply` (which already holds the reply header).
    fn call(&self, call: &Call<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal>;
    /// Finishes what a call left for after its reply had left (it asked with
    /// [`ReplyBuf::call_back_after_sending`]): called once, with the same
    /// call, whether or not the reply could be sent.
    fn after_reply(&self, call: &Call<'_>) {
        let _ = call;
    }
}

/// Which thread runs a call. A call on the connection's reader saves two
/// thread hand-offs (a wake-up each); one on a worker never holds up the
/// calls behind it on its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// On the reader: the call finishes in microseconds without blocking,
    /// less than the hand-offs would cost even with calls queued behind it
    /// (NULL, a GETATTR the host answers from its caches, a CREATE or a
    /// REMOVE: a few words of one directory's metadata, which changes of
    /// that directory take one at a time anyway).
    Reader,
    /// On the reader when the connection has nothing else to do, no call in
    /// flight and no byte of another record read: the call takes tens to a
    /// few hundred microseconds without blocking (an UNSTABLE WRITE, a
    /// truncation, a listing of a thousand entries kept in memory), which a
    /// client that waits for each reply would otherwise spend on the
    /// hand-offs too.
    ReaderWhenIdle,
    /// On a worker: the call may block for milliseconds (an fsync, a walk,
    /// a copy-up).
    Worker,
}

/// What became of one record.
#[derive(Debug)]
pub enum Outcome {
    /// A framed reply to send.
    Reply(Frame),
    /// A framed reply to send, and then [`Dispatcher::after_reply`] to call
    /// with the same record: the program left work until the reply is gone.
    ReplyThen(Frame),
    /// Nothing to send; the reason was logged.
    Dropped,
}

/// A record whose envelope has been decoded: the call's header and the
/// program it is for, or what the envelope alone answers. It does not
/// borrow the record, so it travels with the record to a worker.
#[derive(Debug)]
pub struct Routed {
    envelope: Envelope,
    /// The index of the call's program among the dispatcher's.
    program: Option<usize>,
}

/// Calls answered, per program and procedure.
struct ProgramEntry {
    program: Box<dyn Program>,
    /// Index `proc` counts calls to that procedure; the last slot counts calls
    /// to procedures that do not exist.
    calls: Vec<AtomicU64>,
    /// How long each procedure ran, by the same index.
    latency: Vec<Latency>,
}

/// One procedure's figures: calls, and how long they ran (the procedure
/// itself, not the wait for a worker), to within a factor of two.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcedureStats {
    pub program: u32,
    pub name: &'static str,
    pub calls: u64,
    pub p50: Duration,
    pub p99: Duration,
}

/// Routes records to programs and counts what it did.
pub struct Dispatcher {
    programs: Vec<ProgramEntry>,
    rejected: AtomicU64,
    dropped: AtomicU64,
}

/// Procedures per program that get a counter of their own.
const COUNTED_PROCS: u32 = 32;

impl Dispatcher {
    pub fn new(programs: Vec<Box<dyn Program>>) -> Self {
        let programs = programs
            .into_iter()
            .map(|program| ProgramEntry {
                program,
                calls: (0..=COUNTED_PROCS).map(|_| AtomicU64::new(0)).collect(),
                latency: (0..=COUNTED_PROCS).map(|_| Latency::default()).collect(),
            })
            .collect();
        Dispatcher {
            programs,
            rejected: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Decodes the envelope of `record`: the one decode its call's life
    /// reads from.
    pub fn route(&self, record: &[u8]) -> Routed {
        let envelope = envelope::decode_call(record);
        let program = match &envelope {
            Envelope::Call(header) => self
                .programs
                .iter()
                .position(|e| e.program.number() == header.prog),
            _ => None,
        };
        Routed { envelope, program }
    }

    /// The call in `routed` as its program sees it, when it is one the
    /// program serves (its version within the program's).
    fn served<'a>(
        &'a self,
        routed: &'a Routed,
        record: &'a [u8],
        peer: Option<IpAddr>,
    ) -> Option<(&'a ProgramEntry, Call<'a>)> {
        let (Envelope::Call(header), Some(at)) = (&routed.envelope, routed.program) else {
            return None;
        };
        let entry = &self.programs[at];
        let (low, high) = entry.program.versions();
        (low..=high)
            .contains(&header.vers)
            .then(|| (entry, Call::of(header, record, peer)))
    }

    /// Which thread runs the call `routed` from `record` (see
    /// [`Program::placement`]). Records that are not calls a program
    /// serves run on the reader: they are answered from the envelope alone.
    pub fn placement(&self, routed: &Routed, record: &[u8]) -> Placement {
        match self.served(routed, record, None) {
            Some((entry, call)) => entry.program.placement(&call),
            None => Placement::Reader,
        }
    }

    /// Answers one record received from `peer`: [`route`](Self::route)
    /// and [`answer`](Self::answer) in one.
    pub fn handle(&self, record: &[u8], peer: Option<IpAddr>) -> Outcome {
        self.answer(&self.route(record), record, peer)
    }

    /// Answers the record `routed` was decoded from.
    pub fn answer(&self, routed: &Routed, record: &[u8], peer: Option<IpAddr>) -> Outcome {
        match &routed.envelope {
            Envelope::Call(header) => match self.call(routed, header, record, peer) {
                Some(reply) if reply.calls_back() => Outcome::ReplyThen(reply.into_frame()),
                Some(reply) => Outcome::Reply(reply.into_frame()),
                None => {
                    self.dropped.fetch_add(1, Relaxed);
                    Outcome::Dropped
                }
            },
            &Envelope::Denied { xid, why } => {
                self.rejected.fetch_add(1, Relaxed);
                tracing::debug!(xid, ?why, "call denied");
                Outcome::Reply(envelope::denied_reply(xid, why).into_frame())
            }
            Envelope::Drop(reason) => {
                self.dropped.fetch_add(1, Relaxed);
                tracing::warn!(?peer, len = record.len(), "dropped record: {reason}");
                Outcome::Dropped
            }
        }
    }

    /// Finishes a record answered with [`Outcome::ReplyThen`], once its
    /// reply has left (see [`Program::after_reply`]).
    pub fn after_reply(&self, routed: &Routed, record: &[u8], peer: Option<IpAddr>) {
        let Some((entry, call)) = self.served(routed, record, peer) else {
            return;
        };
        let done = panic::catch_unwind(AssertUnwindSafe(|| entry.program.after_reply(&call)));
        if done.is_err() {
            let name = entry.program.procedure_name(call.proc).unwrap_or("?");
            tracing::error!(xid = call.xid, proc = name, "after_reply panicked");
        }
    }

    /// The reply to a call, or `None` where the program answers nothing.
    fn call(
        &self,
        routed: &Routed,
        header: &CallHeader,
        record: &[u8],
        peer: Option<IpAddr>,
    ) -> Option<ReplyBuf> {
        let xid = header.xid;
        let Some(entry) = routed.program.map(|at| &self.programs[at]) else {
            self.rejected.fetch_add(1, Relaxed);
            tracing::debug!(xid, prog = header.prog, "program unavailable");
            return Some(envelope::accepted_reply(xid, Accepted::ProgUnavail));
        };
        let (low, high) = entry.program.versions();
        if !(low..=high).contains(&header.vers) {
            self.rejected.fetch_add(1, Relaxed);
            return Some(envelope::accepted_reply(
                xid,
                Accepted::ProgMismatch { low, high },
            ));
        }
        let slot = header.proc.min(COUNTED_PROCS) as usize;
        entry.calls[slot].fetch_add(1, Relaxed);
        let call = Call::of(header, record, peer);
        let mut reply = envelope::accepted_reply(xid, Accepted::Success);
        // A bug in a procedure must cost one call, not the worker thread and
        // with it the connection's window slot: it is answered SYSTEM_ERR.
        let started = Instant::now();
        let outcome =
            panic::catch_unwind(AssertUnwindSafe(|| entry.program.call(&call, &mut reply)))
                .unwrap_or_else(|_| {
                    let name = entry.program.procedure_name(header.proc).unwrap_or("?");
                    tracing::error!(xid, proc = name, "procedure panicked; answered SYSTEM_ERR");
                    Err(Refusal::SystemErr)
                });
        entry.latency[slot].record(started.elapsed());
        match outcome {
            Ok(()) => Some(reply),
            Err(Refusal::Dropped) => None,
            Err(Refusal::AuthTooWeak) => {
                self.rejected.fetch_add(1, Relaxed);
                let denial = envelope::Denial::Auth(envelope::AuthError::TooWeak);
                Some(envelope::denied_reply(xid, denial))
            }
            Err(refusal) => {
                self.rejected.fetch_add(1, Relaxed);
                let name = entry.program.procedure_name(header.proc).unwrap_or("?");
                tracing::debug!(xid, proc = name, ?refusal, "call refused");
                let stat = match refusal {
                    Refusal::ProcUnavail => Accepted::ProcUnavail,
                    Refusal::GarbageArgs => Accepted::GarbageArgs,
                    Refusal::SystemErr | Refusal::Dropped | Refusal::AuthTooWeak => {
                        Accepted::SystemErr
                    }
                };
                Some(envelope::accepted_reply(xid, stat))
            }
        }
    }

    /// Records refused with an RPC-level error (denied, unavailable, garbage).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Relaxed)
    }

    /// Records dropped without a reply.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }

    /// Calls and their p50/p99 running times, for procedures called at
    /// least once.
    pub fn procedures(&self) -> Vec<ProcedureStats> {
        let mut out = Vec::new();
        for entry in &self.programs {
            for (proc, latency) in entry.latency.iter().enumerate() {
                let counts = latency.counts();
                let calls = counts.iter().sum();
                let (Some(p50), Some(p99)) = (quantile(&counts, 0.5), quantile(&counts, 0.99))
                else {
                    continue;
                };
                out.push(ProcedureStats {
                    program: entry.program.number(),
                    name: entry
                        .program
                        .procedure_name(proc as u32)
                        .unwrap_or("(unknown)"),
                    calls,
                    p50,
                    p99,
                });
            }
        }
        out
    }

    /// Calls that reached a program, as (program, procedure name, count), for
    /// procedures called at least once.
    pub fn calls(&self) -> Vec<(u32, &'static str, u64)> {
        let mut out = Vec::new();
        for entry in &self.programs {
            for (proc, count) in entry.calls.iter().enumerate() {
                let count = count.load(Relaxed);
                if count > 0 {
                    let name = entry
                        .program
                        .procedure_name(proc as u32)
                        .unwrap_or("(unknown)");
                    out.push((entry.program.number(), name, count));
                }
            }
        }
        out
    }
}
