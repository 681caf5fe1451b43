//! The request dispatcher, reachable from the fuzz targets (the `fuzzing`
//! feature): a kernel's request as bytes in, laid out as a ring or as
//! `/dev/fuse` gives it, the answer's bytes out.

use std::sync::Arc;

use layerfs_vfs::Filesystem;

use zerocopy::IntoBytes;

use crate::abi::InHeader;
use crate::attrs::Caching;
use crate::connection::{Connection, KernelInit, Wants};
use crate::devfuse::{self, Buffers, Then};
use crate::door::Door;
use crate::wire::{self, Answered, Body, IN_HEADER_LEN, OUT_HEADER_LEN};

/// A door over a filesystem, without a kernel.
pub struct Dispatcher {
    door: Door,
    answered: Answered,
    device: Buffers,
}

impl Dispatcher {
    pub fn over(fs: Arc<dyn Filesystem>) -> Dispatcher {
        Dispatcher {
            door: Door::new(fs, Caching::Exclusive),
            answered: Answered::default(),
            device: Buffers::new(),
        }
    }

    /// A door as it serves a connection whose INIT offered `flags` (the
    /// capabilities as one word), asking for passthrough and with the
    /// writeback cache where `exclusive`: what it agrees to decides how
    /// it answers. Its device is `/dev/null`: a backing file it registers
    /// is refused, a notification it sends goes nowhere.
    pub fn after_init(fs: Arc<dyn Filesystem>, flags: u64, exclusive: bool) -> Dispatcher {
        let caching = match exclusive {
            true => Caching::Exclusive,
            false => Caching::Shared,
        };
        let device = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null");
        let kernel = KernelInit {
            major: 7,
            minor: 41,
            max_readahead: 1 << 20,
            flags,
        };
        let wants = Wants {
            caching,
            passthrough: true,
            rings: false,
        };
        let connection = Connection::resume(device.into(), kernel, wants);
        Dispatcher {
            door: Door::answering(fs, caching, Arc::new(connection)),
            answered: Answered::default(),
            device: Buffers::new(),
        }
    }

    /// Answers request `opcode` on node `nodeid` from `uid`/`gid`, its
    /// operation's struct `op` and the rest `payload` laid out as a ring
    /// lays them: the errno (negative, or 0) and the answer's body.
    pub fn answer(
        &mut self,
        (opcode, nodeid): (u32, u64),
        (uid, gid): (u32, u32),
        op: &[u8],
        payload: &[u8],
    ) -> (i32, &[u8]) {
        let header = InHeader {
            opcode,
            nodeid,
            uid,
            gid,
            unique: 1,
            ..Default::default()
        };
        let request = crate::request::Request::parse(opcode, Body::split(op, payload, 0));
        wire::answer(&self.door, &header, request, &mut self.answered);
        (self.answered.error, &self.answered.body)
    }

    /// Answers the same request laid out as `/dev/fuse` gives it: the
    /// header, `args`, then `extensions` 8-byte units of `x`, the header
    /// saying `longer` bytes more than were read. None where no answer
    /// goes back (a FORGET); else the errno and the answer's body, whose
    /// header must say its length.
    pub fn answer_from_device(
        &mut self,
        (opcode, nodeid): (u32, u64),
        (uid, gid): (u32, u32),
        args: &[u8],
        (extensions, longer): (u16, u32),
    ) -> Option<(i32, &[u8])> {
        let request = self.device.request_mut();
        let len = IN_HEADER_LEN + args.len() + 8 * usize::from(extensions);
        if len > request.len() {
            return None;
        }
        let header = InHeader {
            len: len as u32 + longer,
            opcode,
            nodeid,
            uid,
            gid,
            unique: 1,
            total_extlen: extensions,
            ..Default::default()
        };
        request[..IN_HEADER_LEN].copy_from_slice(header.as_bytes());
        request[IN_HEADER_LEN..IN_HEADER_LEN + args.len()].copy_from_slice(args);
        request[IN_HEADER_LEN + args.len()..len].fill(b'x');
        let out = match devfuse::step(&self.door, &mut self.device, len) {
            Then::Nothing => return None,
            Then::Answer(out) | Then::AnswerAndEnd(out) => out,
            // Answered as where it cannot be spliced.
            Then::Read(unique, source) => self.device.copy(unique, &source),
        };
        let body = self.device.body(&out);
        assert_eq!(out.len as usize, OUT_HEADER_LEN + body.len(), "{opcode}");
        assert_eq!(out.unique, 1, "{opcode}: answered as another request");
        Some((out.error, body))
    }
}
