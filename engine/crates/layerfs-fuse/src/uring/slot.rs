//! One ring slot: the buffers a request is fetched into and answered in,
//! registered with the kernel once, and the commands that lend them.

use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::{opcode, squeue, types};
use zerocopy::{FromZeros, IntoBytes};

use crate::abi::{self, opcode as fuse_op, InHeader, ReadIn, UringCmdReq, UringReqHeader};
use crate::door::Door;
use crate::request::Request;
use crate::wire::{self, Answered, Body, IN_HEADER_LEN, OUT_HEADER_LEN};

/// A slot's header buffer, as the kernel registers it.
const HEADER_LEN: usize = std::mem::size_of::<UringReqHeader>();

/// The largest request or answer body: the kernel refuses a buffer smaller
/// than its `max_write` or `max_pages`. Allocated zeroed, so a page of it
/// is resident only once a request has used it.
const PAYLOAD_LEN: usize = crate::limits::MAX_WRITE as usize;

/// A READ at least this large goes to the ring's reader thread. The
/// readahead of a door run as root asks 1 MiB at a time: a cold 1 GiB
/// read took 0.58-0.63 s on the ring's thread and 0.46-0.48 s handed to
/// the reader. A user's door asks 128 KiB (the kernel's default window):
/// 0.62-0.74 s on the ring's thread, 0.69-0.78 s handed over (0.46-0.51 s
/// through `/dev/fuse`).
const LARGE_READ: u32 = 256 * 1024;

/// One request's buffers, registered with the kernel once.
pub(super) struct Slot {
    header: Box<UringReqHeader>,
    payload: Vec<u8>,
    /// `struct iovec[2]` naming them (address, length, address, length),
    /// for the registration; the buffers stay where they are when the
    /// slot moves.
    iov: Box<[usize; 4]>,
}

impl Slot {
    pub(super) fn new() -> Slot {
        let mut header = Box::new(UringReqHeader::new_zeroed());
        let mut payload = vec![0u8; PAYLOAD_LEN];
        let iov = Box::new([
            header.as_mut_bytes().as_mut_ptr() as usize,
            HEADER_LEN,
            payload.as_mut_ptr() as usize,
            PAYLOAD_LEN,
        ]);
        Slot {
            header,
            payload,
            iov,
        }
    }

    /// The request's header, where the kernel put it.
    fn in_header(&self) -> InHeader {
        abi::args(&self.header.in_out).expect("128 bytes hold an in header")
    }

    /// Whether the request is a READ large enough for the reader thread.
    pub(super) fn is_large_read(&self) -> bool {
        self.in_header().opcode == fuse_op::READ
            && abi::args::<ReadIn>(&self.header.op_in).is_some_and(|read| read.size >= LARGE_READ)
    }

    /// The command lending this slot to queue `qid` of `device`'s
    /// connection for its first request.
    pub(super) fn register(&self, device: &OwnedFd, qid: u16) -> squeue::Entry128 {
        let entry = opcode::UringCmd80::new(types::Fd(device.as_raw_fd()), abi::URING_CMD_REGISTER)
            .cmd(command(qid, 0))
            .addr(Some(self.iov.as_ptr() as u64))
            .build();
        with_len(entry, 2)
    }

    /// The command giving back the answer now in this slot, and lending
    /// the slot for the next request.
    pub(super) fn commit(&self, device: &OwnedFd, qid: u16) -> squeue::Entry128 {
        opcode::UringCmd80::new(
            types::Fd(device.as_raw_fd()),
            abi::URING_CMD_COMMIT_AND_FETCH,
        )
        .cmd(command(qid, self.header.ent.commit_id))
        .build()
    }
}

/// The 80 command bytes, beginning with a `struct fuse_uring_cmd_req`.
fn command(qid: u16, commit_id: u64) -> [u8; 80] {
    let req = UringCmdReq {
        commit_id,
        qid,
        ..Default::default()
    };
    let mut cmd = [0u8; 80];
    req.write_to_prefix(&mut cmd)
        .expect("80 bytes hold a command");
    cmd
}

/// io-uring's builder has no field for `len`, which a REGISTER must set to
/// the number of iovecs (two).
#[allow(unsafe_code)]
fn with_len(entry: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is repr(C): an io_uring_sqe (64 bytes, plain
    // integers) then 64 command bytes, and any bytes are a valid value of
    // it. `len` is the sqe's u32 at byte 24.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[24..28].copy_from_slice(&len.to_ne_bytes());
    unsafe { std::mem::transmute(bytes) }
}

/// Answers the request in `slot` there, as the kernel reads it: the out
/// header where the request's header was, the body in the payload. A
/// request that cannot be read is answered EIO: its caller, and every later
/// one on this CPU, would otherwise wait for ever.
pub(super) fn answer(slot: &mut Slot, door: &Door, answered: &mut Answered) {
    let header = slot.in_header();
    let payload = slot.header.ent.payload_sz as usize;
    let op = (header.len as usize)
        .checked_sub(IN_HEADER_LEN + payload)
        .filter(|op| *op <= abi::URING_HEADER_SZ && payload <= PAYLOAD_LEN);
    let Some(op) = op else {
        tracing::warn!(
            "FUSE request {} of {} bytes with {payload} in its payload: answered EIO",
            header.opcode,
            header.len
        );
        return answer_with(slot, header.unique, -libc::EIO, 0);
    };
    let body = Body::split(
        &slot.header.op_in[..op],
        &slot.payload[..payload],
        header.total_extlen,
    );
    let request = match Request::parse(header.opcode, body) {
        // A READ's data goes straight into the ring's buffer.
        Ok(Request::Read(read)) => {
            if let Some((error, len)) = wire::read_direct(door, &header, &read, &mut slot.payload) {
                return answer_with(slot, header.unique, error, len);
            }
            Ok(Request::Read(read))
        }
        other => other,
    };
    wire::answer(door, &header, request, answered);
    if answered.body.len() > PAYLOAD_LEN {
        return answer_with(slot, header.unique, -libc::ERANGE, 0);
    }
    slot.payload[..answered.body.len()].copy_from_slice(&answered.body);
    answer_with(slot, header.unique, answered.error, answered.body.len())
}

/// Puts the out header of an answer of `len` payload bytes (or of `error`)
/// in `slot`.
fn answer_with(slot: &mut Slot, unique: u64, error: i32, len: usize) {
    let out = wire::out_header(unique, error, len);
    slot.header.in_out[..OUT_HEADER_LEN].copy_from_slice(out.as_bytes());
    slot.header.ent.payload_sz = len as u32;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use layerfs_vfs::LocalFs;
    use zerocopy::FromBytes;

    use super::*;
    use crate::abi::OutHeader;
    use crate::attrs::Caching;

    const ROOT: u64 = 1;

    fn door(dir: &std::path::Path) -> Door {
        Door::new(Arc::new(LocalFs::open(dir).unwrap()), Caching::Shared)
    }

    /// Puts request `opcode` on `nodeid` in `slot` as the kernel does: its
    /// header, its struct `op` in `op_in`, the rest in the payload; the
    /// header says `len`, or the length of all three.
    fn put(
        slot: &mut Slot,
        (opcode, nodeid): (u32, u64),
        op: &[u8],
        rest: &[u8],
        len: Option<u32>,
    ) {
        let header = InHeader {
            len: len.unwrap_or((IN_HEADER_LEN + op.len() + rest.len()) as u32),
            opcode,
            unique: 70,
            nodeid,
            ..Default::default()
        };
        slot.header.in_out.fill(0);
        slot.header.in_out[..IN_HEADER_LEN].copy_from_slice(header.as_bytes());
        slot.header.op_in[..op.len()].copy_from_slice(op);
        slot.payload[..rest.len()].copy_from_slice(rest);
        slot.header.ent.payload_sz = rest.len() as u32;
    }

    /// The answer in `slot`: its out header and its body.
    fn answered(slot: &Slot) -> (OutHeader, &[u8]) {
        let (out, _) = OutHeader::read_from_prefix(&slot.header.in_out).unwrap();
        (out, &slot.payload[..slot.header.ent.payload_sz as usize])
    }

    #[test]
    fn a_request_is_answered_in_its_own_slot() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"in the payload").unwrap();
        let d = door(dir.path());
        let (mut slot, mut scratch) = (Slot::new(), Answered::default());
        put(&mut slot, (fuse_op::LOOKUP, ROOT), &[], b"f\0", None);
        answer(&mut slot, &d, &mut scratch);
        let (out, body) = answered(&slot);
        assert_eq!((out.error, out.unique), (0, 70));
        assert_eq!((out.len as usize, body.len()), (OUT_HEADER_LEN + 128, 128));
        let nodeid = u64::from_ne_bytes(body[..8].try_into().unwrap());

        let read = ReadIn {
            offset: 3,
            size: 100,
            ..Default::default()
        };
        put(
            &mut slot,
            (fuse_op::READ, nodeid),
            read.as_bytes(),
            &[],
            None,
        );
        answer(&mut slot, &d, &mut scratch);
        let (out, body) = answered(&slot);
        assert_eq!((out.error, body), (0, &b"the payload"[..]));
        assert_eq!(out.len as usize, OUT_HEADER_LEN + body.len());

        put(&mut slot, (fuse_op::LOOKUP, ROOT), &[], b"none\0", None);
        answer(&mut slot, &d, &mut scratch);
        let (out, body) = answered(&slot);
        assert_eq!(
            (out.error, out.len as usize),
            (-libc::ENOENT, OUT_HEADER_LEN)
        );
        assert!(body.is_empty(), "no body left from the READ");
    }

    #[test]
    fn a_header_that_disagrees_with_its_slot_is_answered_eio() {
        let dir = tempfile::tempdir().unwrap();
        let d = door(dir.path());
        let (mut slot, mut scratch) = (Slot::new(), Answered::default());
        let short = IN_HEADER_LEN as u32 + 1;
        let long = (IN_HEADER_LEN + abi::URING_HEADER_SZ + 3) as u32 + 1;
        for len in [0, short, long] {
            put(&mut slot, (fuse_op::LOOKUP, ROOT), &[], b"f\0", Some(len));
            answer(&mut slot, &d, &mut scratch);
            let (out, body) = answered(&slot);
            assert_eq!(
                (out.error, out.unique),
                (-libc::EIO, 70),
                "header says {len}"
            );
            assert!(body.is_empty());
        }
        put(&mut slot, (fuse_op::LOOKUP, ROOT), &[], b"f\0", None);
        slot.header.ent.payload_sz = PAYLOAD_LEN as u32 + 1;
        answer(&mut slot, &d, &mut scratch);
        assert_eq!(
            answered(&slot).0.error,
            -libc::EIO,
            "a payload past the slot"
        );
    }

    #[test]
    fn large_reads_are_told_apart_and_commands_name_their_queue() {
        let mut slot = Slot::new();
        for (opcode, size, large) in [
            (fuse_op::READ, LARGE_READ, true),
            (fuse_op::READ, LARGE_READ - 1, false),
            (fuse_op::WRITE, LARGE_READ, false),
        ] {
            let read = ReadIn {
                size,
                ..Default::default()
            };
            put(&mut slot, (opcode, 5), read.as_bytes(), &[], None);
            assert_eq!(slot.is_large_read(), large, "{opcode} of {size}");
        }
        let (req, _) = UringCmdReq::read_from_prefix(&command(3, 99)).unwrap();
        assert_eq!((req.qid, req.commit_id, req.flags), (3, 99, 0));
    }
}
