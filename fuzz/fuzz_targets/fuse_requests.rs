//! Random FUSE requests, in the kernel's bytes, through the door's one
//! dispatcher over a `StackFs`: the arguments as a ring lays them or as
//! `/dev/fuse` gives them (with extensions, and headers that say more than
//! came), valid or not. What must always hold: nothing panics; an error answer has no
//! body and a negative errno; a success has the size its request's answer
//! has (an entry 128 bytes, attributes 104, ...); a listing holds whole
//! entries within the size asked; and nothing outside the stack's two
//! directories changes, whatever names come. The door answers as after an
//! INIT whose offered capabilities the input chooses (passthrough, the
//! writeback cache, READDIRPLUS...), or as a door with no connection.
#![no_main]

use std::sync::Arc;

use layerfs_fuse::fuzzing::Dispatcher;
use layerfs_layers::StackFs;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// The requests the door serves, and a few it does not.
const OPCODES: [u32; 36] = [
    1, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 25, 27, 28, 29,
    30, 34, 35, 39, 43, 44, 45, 2, 26, 46, 4096,
];

const NAMES: [&[u8]; 8] = [
    b"a",
    b"b",
    b"sub",
    b"f",
    b"..",
    b".",
    b"../outside",
    b".wh.a",
];

#[derive(Arbitrary, Debug)]
struct Request {
    opcode: u8,
    node: u8,
    other_user: bool,
    /// The operation's struct: arbitrary bytes, cut to the header's room.
    op: Vec<u8>,
    names: Vec<u8>,
    /// Arbitrary bytes after the names (a WRITE's data, a value).
    tail: Vec<u8>,
    /// The payload as given, in place of names and tail.
    raw: Option<Vec<u8>>,
    /// Read from `/dev/fuse` (in one buffer), with these extensions and a
    /// header saying this many bytes more than came, not from a ring.
    device: Option<(u8, u8)>,
}

/// What the kernel's INIT offered, where the door serves a connection.
#[derive(Arbitrary, Debug)]
struct Init {
    flags: u64,
    exclusive: bool,
}

fuzz_target!(|input: (Option<Init>, Vec<Request>)| {
    let (init, requests) = input;
    let dir = tempfile::tempdir().unwrap();
    let (lower, upper, outside) = (
        dir.path().join("l"),
        dir.path().join("u"),
        dir.path().join("outside"),
    );
    for d in [&lower, &upper, &outside] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(lower.join("f"), b"lower file").unwrap();
    std::fs::create_dir(lower.join("sub")).unwrap();
    let stack = StackFs::open_in_upper(&[lower.clone()], &upper).unwrap();
    let mut door = match init {
        Some(init) => Dispatcher::after_init(Arc::new(stack), init.flags, init.exclusive),
        None => Dispatcher::over(Arc::new(stack)),
    };
    let me = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    let mut nodes: Vec<u64> = vec![1];
    for r in requests.iter().take(64) {
        let opcode = OPCODES[r.opcode as usize % OPCODES.len()];
        let nodeid = nodes[r.node as usize % nodes.len()];
        let op = &r.op[..r.op.len().min(128)];
        let payload = match &r.raw {
            Some(raw) => raw[..raw.len().min(1 << 16)].to_vec(),
            None => {
                let mut p = Vec::new();
                for &n in r.names.iter().take(2) {
                    p.extend_from_slice(NAMES[n as usize % NAMES.len()]);
                    p.push(0);
                }
                p.extend_from_slice(&r.tail[..r.tail.len().min(4096)]);
                p
            }
        };
        let who = if r.other_user { (4242, 4242) } else { me };
        let whole = [op, &payload].concat();
        let (error, body, args) = match r.device {
            None => {
                let (error, body) = door.answer((opcode, nodeid), who, op, &payload);
                (error, body, op)
            }
            Some((extensions, longer)) => {
                let layout = (u16::from(extensions % 4), u32::from(longer % 3));
                match door.answer_from_device((opcode, nodeid), who, &whole, layout) {
                    Some((error, body)) => (error, body, &whole[..]),
                    None => continue,
                }
            }
        };
        assert!(error <= 0 && error > -4096, "{opcode}: errno {error}");
        if error != 0 {
            assert!(body.is_empty(), "{opcode}: an error with a body");
            continue;
        }
        let expected = match opcode {
            1 | 6 | 8 | 9 | 13 => Some(128),
            35 => Some(144),
            3 | 4 => Some(104),
            14 | 27 => Some(16),
            16 => Some(8),
            17 => Some(80),
            10 | 11 | 12 | 18 | 20 | 24 | 29 | 30 | 34 | 43 | 45 => Some(0),
            _ => None,
        };
        if let Some(len) = expected {
            // A negative lookup is an entry of node 0.
            assert_eq!(body.len(), len, "{opcode}: {} bytes", body.len());
        }
        if matches!(opcode, 1 | 6 | 8 | 9 | 13 | 35) {
            let node = u64::from_ne_bytes(body[..8].try_into().unwrap());
            if node != 0 && nodes.len() < 64 && !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        if matches!(opcode, 28 | 44) {
            let asked =
                (args.len() >= 24).then(|| u32::from_ne_bytes(args[16..20].try_into().unwrap()));
            assert!(
                asked.is_some_and(|size| body.len() <= size as usize),
                "{opcode}: {} bytes",
                body.len()
            );
            let head = if opcode == 28 { 24 } else { 152 };
            let mut at = 0;
            while at < body.len() {
                let namelen =
                    u32::from_ne_bytes(body[at + head - 8..at + head - 4].try_into().unwrap());
                at += (head + namelen as usize).next_multiple_of(8);
            }
            assert_eq!(at, body.len(), "{opcode}: a listing of cut entries");
        }
    }
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "a name reached outside the stack"
    );
});
