//! RPC programs and the dispatcher that routes a record to one of them.
//!
//! A record is decoded once, by [`Dispatcher::route`]: its envelope, and
//! the call's arguments by their program ([`Program::decode`]). The
//! [`Routed`] it gives is what the later steps of the call's life read: which
//! thread runs it ([`Routed::placement`]), the call itself
//! ([`Dispatcher::answer`]) and the work left for after its reply
//! ([`Dispatcher::after_reply`]). [`Dispatcher::handle`] is the whole life
//! of a call without the socket: bytes of one record in, the framed reply
//! (or nothing) out.

use std::any::Any;
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
    /// Decodes the arguments of `call`, a call whose version is within
    /// `versions()`, once: on the connection's reader, before the call runs.
    /// What it gives is handed to [`call`](Self::call) and
    /// [`after_reply`](Self::after_reply) on whichever thread its placement
    /// names; a refusal is answered at once. `call.peer` is not set. By
    /// default NULL runs on the reader, anything else on a worker, and the
    /// program decodes its arguments in `call`.
    fn decode(&self, call: &Call<'_>) -> Decoded {
        let placement = if call.proc == 0 {
            Placement::Reader
        } else {
            Placement::Worker
        };
        Decoded::new(placement, ())
    }
    /// Runs a call whose version is within `versions()`, with what
    /// [`decode`](Self::decode) made of its arguments, appending the
    /// procedure's results to `reply` (which already holds the reply
    /// header).
    fn call(
        &self,
        call: &Call<'_>,
        args: &DecodedArgs,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal>;
    /// Finishes what a call left for after its reply had left (it asked with
    /// [`ReplyBuf::call_back_after_sending`]): called once, with the same
    /// call and arguments, whether or not the reply could be sent.
    fn after_reply(&self, call: &Call<'_>, args: &DecodedArgs) {
        let _ = (call, args);
    }
}

/// A program's arguments for one call, as its [`Program::decode`] made
/// them: the program's own type, downcast by the program. They hold no
/// borrow of the record (spans of the arguments, numbers, shared handles),
/// so they go with it to a worker. `()`, for a program that decodes in
/// [`Program::call`], is not allocated.
pub type DecodedArgs = dyn Any + Send;

/// What [`Program::decode`] made of a call: which thread runs it, and its
/// arguments, or the refusal that answers it at once on the reader.
pub struct Decoded {
    placement: Placement,
    args: Result<Box<DecodedArgs>, Refusal>,
}

impl Decoded {
    pub fn new(placement: Placement, args: impl Any + Send) -> Decoded {
        Decoded {
            placement,
            args: Ok(Box::new(args)),
        }
    }

    /// A call answered with `refusal` at once, on the reader.
    pub fn refused(refusal: Refusal) -> Decoded {
        Decoded {
            placement: Placement::Reader,
            args: Err(refusal),
        }
    }
}

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoded")
            .field("placement", &self.placement)
            .field("refused", &self.args.as_ref().err())
            .finish_non_exhaustive()
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

/// A decoded record: the call's header, the program it is for and what
/// that program made of its arguments, or what the envelope alone answers.
/// It does not borrow the record, so it travels with the record to a
/// worker.
#[derive(Debug)]
pub struct Routed {
    envelope: Envelope,
    /// The index of the call's program among the dispatcher's.
    program: Option<usize>,
    /// The program's decode, for a call it serves (its version within the
    /// program's).
    decoded: Option<Decoded>,
}

impl Routed {
    /// Which thread runs the call (see [`Program::decode`]). Records that
    /// are not calls a program serves, and calls refused when decoded, are
    /// answered on the reader: from the envelope, or with the refusal.
    pub fn placement(&self) -> Placement {
        match &self.decoded {
            Some(Decoded {
                placement,
                args: Ok(_),
            }) => *placement,
            _ => Placement::Reader,
        }
    }
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

    /// Decodes `record`: its envelope, and the call's arguments by the
    /// program it is for. The one decode its call's life reads from.
    pub fn route(&self, record: &[u8]) -> Routed {
        let envelope = envelope::decode_call(record);
        let program = match &envelope {
            Envelope::Call(header) => self
                .programs
                .iter()
                .position(|e| e.program.number() == header.prog),
            _ => None,
        };
        let mut routed = Routed {
            envelope,
            program,
            decoded: None,
        };
        if let Some((entry, call)) = self.served(&routed, record, None) {
            // A bug in a decoder costs one call, as one in a procedure does.
            let decoded = panic::catch_unwind(AssertUnwindSafe(|| entry.program.decode(&call)))
                .unwrap_or_else(|_| {
                    let name = entry.program.procedure_name(call.proc).unwrap_or("?");
                    tracing::error!(xid = call.xid, proc = name, "decode panicked");
                    Decoded::refused(Refusal::SystemErr)
                });
            routed.decoded = Some(decoded);
        }
        routed
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
        let Some(Ok(args)) = routed.decoded.as_ref().map(|d| &d.args) else {
            return;
        };
        let done = panic::catch_unwind(AssertUnwindSafe(|| {
            entry.program.after_reply(&call, args.as_ref())
        }));
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
        let outcome = match routed.decoded.as_ref().map(|d| &d.args) {
            Some(Ok(args)) => panic::catch_unwind(AssertUnwindSafe(|| {
                entry.program.call(&call, args.as_ref(), &mut reply)
            }))
            .unwrap_or_else(|_| {
                let name = entry.program.procedure_name(header.proc).unwrap_or("?");
                tracing::error!(xid, proc = name, "procedure panicked; answered SYSTEM_ERR");
                Err(Refusal::SystemErr)
            }),
            Some(Err(refused)) => Err(*refused),
            // Every call a program serves was decoded by `route`.
            None => Err(Refusal::SystemErr),
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Program 7: procedure 1's arguments are refused when decoded, 2's
    /// decoder panics, 3's decoder reads a word that its call echoes.
    struct Decoding {
        calls: Arc<AtomicUsize>,
    }

    impl Program for Decoding {
        fn number(&self) -> u32 {
            7
        }

        fn versions(&self) -> (u32, u32) {
            (1, 1)
        }

        fn procedure_name(&self, _: u32) -> Option<&'static str> {
            Some("P")
        }

        fn decode(&self, call: &Call<'_>) -> Decoded {
            match call.proc {
                1 => Decoded::refused(Refusal::GarbageArgs),
                2 => panic!("a bug in a decoder"),
                _ => match crate::xdr::Cursor::new(call.args).u32() {
                    Some(word) => Decoded::new(Placement::Worker, word),
                    None => Decoded::refused(Refusal::GarbageArgs),
                },
            }
        }

        fn call(
            &self,
            _: &Call<'_>,
            args: &DecodedArgs,
            reply: &mut ReplyBuf,
        ) -> Result<(), Refusal> {
            self.calls.fetch_add(1, Relaxed);
            let word: &u32 = args.downcast_ref().ok_or(Refusal::SystemErr)?;
            reply.extend_from_slice(&word.to_be_bytes());
            Ok(())
        }
    }

    fn record(proc: u32, args: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for w in [9, 0, 2, 7, 1, proc, 0, 0, 0, 0] {
            out.extend_from_slice(&u32::to_be_bytes(w));
        }
        out.extend_from_slice(args);
        out
    }

    /// The reply's accept_stat and what follows it.
    fn answer(d: &Dispatcher, record: &[u8]) -> (u32, Vec<u8>) {
        let Outcome::Reply(frame) = d.handle(record, None) else {
            panic!("no reply")
        };
        let body = &frame.bytes()[4 + 20..];
        let stat = u32::from_be_bytes(body[..4].try_into().unwrap());
        (stat, body[4..].to_vec())
    }

    #[test]
    fn the_call_gets_what_its_decode_made_and_a_refusal_is_answered_at_once() {
        let calls = Arc::new(AtomicUsize::new(0));
        let program = Decoding {
            calls: calls.clone(),
        };
        let d = Dispatcher::new(vec![Box::new(program)]);
        let routed = d.route(&record(3, &[0, 0, 0, 42]));
        assert_eq!(routed.placement(), Placement::Worker);
        assert_eq!(
            answer(&d, &record(3, &[0, 0, 0, 42])),
            (0, vec![0, 0, 0, 42])
        );
        // GARBAGE_ARGS (4), on the reader, without the call.
        let routed = d.route(&record(1, &[]));
        assert_eq!(routed.placement(), Placement::Reader);
        assert_eq!(answer(&d, &record(1, &[])), (4, vec![]));
        assert_eq!(answer(&d, &record(3, &[0, 0])), (4, vec![]));
        // A panicking decoder: SYSTEM_ERR (5), and the dispatcher goes on.
        assert_eq!(answer(&d, &record(2, &[])), (5, vec![]));
        assert_eq!(answer(&d, &record(3, &[0, 0, 0, 7])), (0, vec![0, 0, 0, 7]));
        assert_eq!(d.rejected(), 3);
        assert_eq!(calls.load(Relaxed), 2, "the refused calls never ran");
    }
}
