//! Load generation for RPC servers on loopback, and the raw TCP floor they are
//! measured against. The peers and the table live in `benches/nfs_load.rs`.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

use layerfs_rpc::Records;
use nfs3_types::rpc::{auth_unix, call_body, msg_body, opaque_auth, rpc_msg};
use nfs3_types::xdr_codec::{Opaque, Pack};

/// What one load run measured.
#[derive(Clone, Debug)]
pub struct LoadResult {
    pub calls: u64,
    pub elapsed: Duration,
    /// Latency percentiles in microseconds.
    pub p50_us: f64,
    pub p99_us: f64,
    /// Replies that were not a success: refused by RPC, or an NFS status
    /// other than NFS3_OK.
    pub errors: u64,
    /// The p50 and p99 of the calls `is_probe` picked, in microseconds,
    /// if it picked any: small calls among large ones.
    pub probes_us: Option<(f64, f64)>,
}

impl LoadResult {
    pub fn calls_per_sec(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
}

/// An xid no earlier run of this process, and most likely no other process,
/// started from: servers keep replies to changing calls by xid, and a run
/// whose xids and arguments repeat an earlier run's would be answered from
/// that cache instead of being run.
pub fn xid_base() -> u32 {
    static RUNS: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let run = RUNS.fetch_add(1, Relaxed);
    (nanos ^ std::process::id().rotate_left(16)).wrapping_add(run.wrapping_mul(0x9E37_79B9))
}

/// Bytes of an accepted reply before its results (xid on, AUTH_NONE verifier).
pub const REPLY_HEADER: usize = 24;

/// Whether an RPC reply (from its xid on) is a success: accepted, and for a
/// procedure with results, NFS3_OK (the first word of every NFSv3 result).
/// Expects an AUTH_NONE verifier, as every server measured here sends.
pub fn reply_ok(reply: &[u8]) -> bool {
    let word = |i: usize| {
        reply
            .get(i * 4..i * 4 + 4)
            .map(|w| u32::from_be_bytes(w.try_into().expect("4 bytes")))
    };
    let accepted = word(2) == Some(0) && word(4) == Some(0) && word(5) == Some(0);
    accepted && word(6).is_none_or(|status| status == 0)
}

/// Drives one connection with `depth` calls in flight for `duration` (after
/// `warmup` calls), each call framed by `call(xid, seq)`: `xid` goes on the
/// wire (from a fresh [`xid_base`] each run), `seq` counts the run's calls
/// from 0 for names and offsets. Stops early at `max_calls`. Like the Linux
/// client, which corks its socket while calls are queued, calls issued for
/// replies that arrived together leave in one write. Every reply's status
/// is checked, and `right(seq, results)` checks its results (the bytes after
/// the accepted reply's header) ([`LoadResult::errors`]). The latencies of
/// the calls `is_probe(seq)` picks are also taken apart
/// ([`LoadResult::probes_us`]).
#[allow(clippy::too_many_arguments)]
pub fn run_load(
    addr: SocketAddr,
    depth: usize,
    warmup: u32,
    duration: Duration,
    max_calls: u32,
    call: impl Fn(u32, u32) -> Vec<u8>,
    is_probe: impl Fn(u32) -> bool,
    right: impl Fn(u32, &[u8]) -> bool,
) -> io::Result<LoadResult> {
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut sender = stream.try_clone()?;
    let mut replies = Records::new(&stream);
    let total = max_calls.saturating_add(warmup);
    let mut sent_at = vec![Instant::now(); total as usize + depth];
    let mut latencies_ns = Vec::with_capacity(total as usize);
    let mut probes_ns = Vec::new();
    let mut outgoing = Vec::new();
    let base = xid_base();
    let mut next_seq = 0u32;
    let issue = |outgoing: &mut Vec<u8>, next_seq: &mut u32| {
        outgoing.extend_from_slice(&call(base.wrapping_add(*next_seq), *next_seq));
        *next_seq += 1;
    };
    while (next_seq as usize) < depth {
        issue(&mut outgoing, &mut next_seq);
    }
    let mut errors = 0u64;
    let mut done = 0u32;
    let mut started = Instant::now();
    let mut measured = 0u64;
    let mut unsent_from = 0u32;
    loop {
        if !outgoing.is_empty() && !replies.has_buffered_record() {
            let now = Instant::now();
            for seq in unsent_from..next_seq {
                sent_at[seq as usize] = now;
            }
            sender.write_all(&outgoing)?;
            outgoing.clear();
            unsent_from = next_seq;
        }
        let Some(reply) = replies.next_record()? else {
            return Err(io::ErrorKind::UnexpectedEof.into());
        };
        let xid = u32::from_be_bytes(reply.as_bytes()[..4].try_into().expect("xid"));
        let seq = xid.wrapping_sub(base);
        if seq >= next_seq {
            return Err(io::Error::other(format!(
                "a reply to xid {xid}, never sent"
            )));
        }
        let bytes = reply.as_bytes();
        errors += u64::from(!(reply_ok(bytes) && right(seq, &bytes[REPLY_HEADER..])));
        let now = Instant::now();
        done += 1;
        if done == warmup {
            started = now;
        } else if done > warmup {
            measured += 1;
            let ns = now.duration_since(sent_at[seq as usize]).as_nanos() as u64;
            latencies_ns.push(ns);
            if is_probe(seq) {
                probes_ns.push(ns);
            }
        }
        let over = done > warmup && (now.duration_since(started) >= duration || done >= total);
        if !over && next_seq < total {
            issue(&mut outgoing, &mut next_seq);
        }
        if done == next_seq {
            break;
        }
    }
    let elapsed = started.elapsed();
    latencies_ns.sort_unstable();
    probes_ns.sort_unstable();
    let pct = |sorted: &[u64], p: f64| {
        let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
        sorted.get(i).copied().unwrap_or(0) as f64 / 1000.0
    };
    Ok(LoadResult {
        calls: measured,
        elapsed,
        p50_us: pct(&latencies_ns, 0.50),
        p99_us: pct(&latencies_ns, 0.99),
        errors,
        probes_us: (!probes_ns.is_empty()).then(|| (pct(&probes_ns, 0.50), pct(&probes_ns, 0.99))),
    })
}

/// A raw TCP server answering every record-marked message with `reply` in one
/// write (its bytes 4..8 replaced by the message's first four bytes, the xid),
/// on its own thread: the floor an RPC server is measured against.
pub fn spawn_floor(reply: Vec<u8>) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reply = reply.clone();
            thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let mut out = &stream;
                let mut records = Records::new(&stream);
                while let Ok(Some(msg)) = records.next_record() {
                    reply[4..8].copy_from_slice(&msg.as_bytes()[..4]);
                    if out.write_all(&reply).is_err() {
                        break;
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// A framed RPC call with an AUTH_SYS credential for root, as a kernel client
/// sends it: mark, header and arguments in one buffer.
pub fn frame_call(xid: u32, prog: u32, vers: u32, proc: u32, args: &impl Pack) -> Vec<u8> {
    let cred = opaque_auth::auth_unix(&auth_unix {
        stamp: 0,
        machinename: Opaque::borrowed(b"bench"),
        uid: 0,
        gid: 0,
        gids: Vec::new(),
    });
    let msg = rpc_msg {
        xid,
        body: msg_body::CALL(call_body {
            rpcvers: 2,
            prog,
            vers,
            proc,
            cred,
            verf: opaque_auth::default(),
        }),
    };
    let mut frame = vec![0; 4];
    msg.pack(&mut frame).expect("packing into memory");
    args.pack(&mut frame).expect("packing into memory");
    let mark = 0x8000_0000u32 | (frame.len() as u32 - 4);
    frame[..4].copy_from_slice(&mark.to_be_bytes());
    frame
}

/// Sends one call on a fresh connection and returns the procedure's results
/// (the bytes after an accepted, successful reply header).
pub fn call_once(
    addr: SocketAddr,
    prog: u32,
    vers: u32,
    proc: u32,
    args: &impl Pack,
) -> io::Result<Vec<u8>> {
    Client::connect(addr)?.call(prog, vers, proc, args)
}

/// One connection that sends calls one at a time, as a single process's
/// system calls reach a kernel client's server.
pub struct Client {
    stream: TcpStream,
    xid: u32,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_nodelay(true)?;
        Ok(Client { stream, xid: 0 })
    }

    /// Sends one call and returns the procedure's results (the bytes after
    /// an accepted, successful reply header).
    pub fn call(
        &mut self,
        prog: u32,
        vers: u32,
        proc: u32,
        args: &impl Pack,
    ) -> io::Result<Vec<u8>> {
        self.xid = self.xid.wrapping_add(1);
        (&self.stream).write_all(&frame_call(self.xid, prog, vers, proc, args))?;
        let mut replies = Records::new(&self.stream);
        let reply = replies.next_record()?.ok_or(io::ErrorKind::UnexpectedEof)?;
        let bytes = reply.as_bytes();
        let word = |i: usize| {
            bytes
                .get(i * 4..i * 4 + 4)
                .map(|w| u32::from_be_bytes(w.try_into().expect("4 bytes")))
        };
        if (word(0), word(1), word(2), word(5)) != (Some(self.xid), Some(1), Some(0), Some(0)) {
            return Err(io::Error::other("the call was not accepted"));
        }
        Ok(bytes[24..].to_vec())
    }
}
