//! Test doubles shared by the transport's tests.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};

/// One thing a [`Script`] does on a `read` call.
#[derive(Clone, Debug)]
pub enum Step {
    /// Bytes the peer sent; a read takes as many as fit and leaves the rest.
    Data(Vec<u8>),
    /// The read is interrupted by a signal before any byte arrives.
    Interrupt,
}

/// A `Read` double that delivers a scripted chunking and counts `read` calls.
#[derive(Debug, Default)]
pub struct Script {
    steps: VecDeque<Step>,
    pub reads: usize,
}

impl Script {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Script {
            steps: steps.into_iter().collect(),
            reads: 0,
        }
    }

    /// All of `bytes` available to the first read.
    pub fn whole(bytes: Vec<u8>) -> Self {
        Script::new([Step::Data(bytes)])
    }

    /// `bytes` arriving in pieces of `size`.
    pub fn pieces(bytes: &[u8], size: usize) -> Self {
        Script::new(bytes.chunks(size).map(|c| Step::Data(c.to_vec())))
    }
}

impl layerfs_rpc::Receive for Script {}

impl Read for Script {
    fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        match self.steps.pop_front() {
            None => Ok(0),
            Some(Step::Interrupt) => Err(ErrorKind::Interrupted.into()),
            Some(Step::Data(mut data)) => {
                let n = dst.len().min(data.len());
                dst[..n].copy_from_slice(&data[..n]);
                if n < data.len() {
                    self.steps.push_front(Step::Data(data.split_off(n)));
                }
                Ok(n)
            }
        }
    }
}

/// A `Write` double that counts calls and accepts at most `max_per_write` bytes each.
#[derive(Debug)]
pub struct Sink {
    pub bytes: Vec<u8>,
    pub writes: usize,
    pub max_per_write: usize,
}

impl Sink {
    pub fn new(max_per_write: usize) -> Self {
        Sink {
            bytes: Vec::new(),
            writes: 0,
            max_per_write,
        }
    }
}

impl layerfs_rpc::Transmit for Sink {}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writes += 1;
        let n = buf.len().min(self.max_per_write);
        self.bytes.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A record of one last fragment holding `body`.
pub fn framed(body: &[u8]) -> Vec<u8> {
    fragments(&[body])
}

/// A record split into the given fragments, the last one marked last.
pub fn fragments(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let mut mark = part.len() as u32;
        if i + 1 == parts.len() {
            mark |= 0x8000_0000;
        }
        out.extend_from_slice(&mark.to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// `len` bytes of a recognisable pattern.
pub fn body(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// An RPC call message (without the record mark).
pub fn call_msg(
    xid: u32,
    rpcvers: u32,
    prog: u32,
    vers: u32,
    proc: u32,
    cred: (u32, &[u8]),
    args: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    for word in [xid, 0, rpcvers, prog, vers, proc] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    push_opaque_auth(&mut out, cred.0, cred.1);
    push_opaque_auth(&mut out, 0, &[]);
    out.extend_from_slice(args);
    out
}

fn push_opaque_auth(out: &mut Vec<u8>, flavor: u32, body: &[u8]) {
    out.extend_from_slice(&flavor.to_be_bytes());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out.resize(out.len() + layerfs_rpc::xdr::padding(body.len()), 0);
}

/// The body of an AUTH_SYS credential.
pub fn auth_sys(machine: &[u8], uid: u32, gid: u32, gids: &[u32]) -> Vec<u8> {
    let mut out = 7u32.to_be_bytes().to_vec();
    push_opaque_auth(&mut out, machine.len() as u32, machine);
    // push_opaque_auth wrote a flavor word first; drop it to leave a plain opaque.
    out.drain(4..8);
    for word in [uid, gid, gids.len() as u32] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    for g in gids {
        out.extend_from_slice(&g.to_be_bytes());
    }
    out
}

/// Big-endian words, for writing expected replies.
pub fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

pub const TEST_PROG: u32 = 200_000;

/// A program for transport tests: 0 NULL, 1 ECHO (one u32 argument, returned),
/// 2 WAIT (blocks until `release` is sent a value), 3 PANIC, 4 WHERE (placed
/// on the reader when the connection is idle; returns 1 when it ran on a
/// worker, 0 on the reader).
pub struct TestProgram {
    pub release: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// LATER's work after its reply waits for a message here, if set.
    pub hold_after: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// The xids of the calls whose work after the reply was done.
    pub called_back: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

impl TestProgram {
    pub fn new() -> Self {
        TestProgram {
            release: std::sync::Mutex::new(None),
            hold_after: std::sync::Mutex::new(None),
            called_back: Default::default(),
        }
    }
}

impl layerfs_rpc::Program for TestProgram {
    fn number(&self) -> u32 {
        TEST_PROG
    }

    fn versions(&self) -> (u32, u32) {
        (2, 3)
    }

    fn procedure_name(&self, proc: u32) -> Option<&'static str> {
        ["NULL", "ECHO", "WAIT", "PANIC", "WHERE", "LATER"]
            .get(proc as usize)
            .copied()
    }

    fn decode(&self, call: &layerfs_rpc::Call<'_>) -> layerfs_rpc::Decoded {
        let placement = match call.proc {
            0 => layerfs_rpc::Placement::Reader,
            4 => layerfs_rpc::Placement::ReaderWhenIdle,
            // LATER: on the reader without arguments, on a worker with.
            5 if call.args.is_empty() => layerfs_rpc::Placement::Reader,
            _ => layerfs_rpc::Placement::Worker,
        };
        layerfs_rpc::Decoded::new(placement, ())
    }

    fn call(
        &self,
        call: &layerfs_rpc::Call<'_>,
        _args: &layerfs_rpc::DecodedArgs,
        reply: &mut layerfs_rpc::ReplyBuf,
    ) -> Result<(), layerfs_rpc::Refusal> {
        match call.proc {
            0 => Ok(()),
            1 if call.args.len() == 4 => {
                reply.extend_from_slice(call.args);
                Ok(())
            }
            1 => Err(layerfs_rpc::Refusal::GarbageArgs),
            2 => {
                if let Some(rx) = self.release.lock().unwrap().as_ref() {
                    let _ = rx.recv();
                }
                Ok(())
            }
            3 => panic!("a bug in a procedure"),
            4 => {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                let on_worker = name.starts_with("rpc-worker");
                reply.extend_from_slice(&u32::from(on_worker).to_be_bytes());
                Ok(())
            }
            5 => {
                reply.call_back_after_sending();
                Ok(())
            }
            _ => Err(layerfs_rpc::Refusal::ProcUnavail),
        }
    }

    fn after_reply(&self, call: &layerfs_rpc::Call<'_>, _args: &layerfs_rpc::DecodedArgs) {
        if let Some(hold) = self.hold_after.lock().unwrap().as_ref() {
            let _ = hold.recv();
        }
        self.called_back.lock().unwrap().push(call.xid);
    }
}
