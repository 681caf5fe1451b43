//! Load generation for RPC servers on loopback, and the raw TCP floor they are
//! measured against. The peers and the table live in `benches/nfs_load.rs`.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
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
}

impl LoadResult {
    pub fn calls_per_sec(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
}

/// Drives one connection with `depth` calls in flight for `duration` (after
/// `warmup` calls), each call framed by `call(xid)`. Stops early at
/// `max_calls`. Like the Linux client, which corks its socket while calls are
/// queued, calls issued for replies that arrived together leave in one write.
pub fn run_load(
    addr: SocketAddr,
    depth: usize,
    warmup: u32,
    duration: Duration,
    max_calls: u32,
    call: impl Fn(u32) -> Vec<u8>,
) -> io::Result<LoadResult> {
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut sender = stream.try_clone()?;
    let mut replies = Records::new(&stream);
    let total = max_calls.saturating_add(warmup);
    let mut sent_at = vec![Instant::now(); total as usize + depth];
    let mut latencies_ns = Vec::with_capacity(total as usize);
    let mut outgoing = Vec::new();
    let mut next_xid = 0u32;
    let issue = |outgoing: &mut Vec<u8>, next_xid: &mut u32| {
        outgoing.extend_from_slice(&call(*next_xid));
        *next_xid += 1;
    };
    while (next_xid as usize) < depth {
        issue(&mut outgoing, &mut next_xid);
    }
    let mut done = 0u32;
    let mut started = Instant::now();
    let mut measured = 0u64;
    let mut unsent_from = 0u32;
    loop {
        if !outgoing.is_empty() && !replies.has_buffered_record() {
            let now = Instant::now();
            for xid in unsent_from..next_xid {
                sent_at[xid as usize] = now;
            }
            sender.write_all(&outgoing)?;
            outgoing.clear();
            unsent_from = next_xid;
        }
        let Some(reply) = replies.next_record()? else {
            return Err(io::ErrorKind::UnexpectedEof.into());
        };
        let xid = u32::from_be_bytes(reply.as_bytes()[..4].try_into().expect("xid"));
        let now = Instant::now();
        done += 1;
        if done == warmup {
            started = now;
        } else if done > warmup {
            measured += 1;
            latencies_ns.push(now.duration_since(sent_at[xid as usize]).as_nanos() as u64);
        }
        let over = done > warmup && (now.duration_since(started) >= duration || done >= total);
        if !over && next_xid < total {
            issue(&mut outgoing, &mut next_xid);
        }
        if done == next_xid {
            break;
        }
    }
    let elapsed = started.elapsed();
    latencies_ns.sort_unstable();
    let pct = |p: f64| {
        let i = ((latencies_ns.len() as f64 - 1.0) * p).round() as usize;
        latencies_ns.get(i).copied().unwrap_or(0) as f64 / 1000.0
    };
    Ok(LoadResult {
        calls: measured,
        elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
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
