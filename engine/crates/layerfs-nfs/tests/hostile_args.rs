//! Random and mangled arguments to every procedure, straight into the
//! dispatcher (no sockets): every record gets a well-formed reply, nothing
//! panics, and nothing outside the export changes.

use std::net::IpAddr;
use std::sync::Arc;

mod support;

use layerfs_rpc::{Dispatcher, Frame, Outcome};
use layerfs_vfs::LocalFs;
use support::call_record;

/// A small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The accept_stat of a reply, after checking its header.
fn accept_stat(frame: &Frame, xid: u32) -> u32 {
    let reply = frame.bytes();
    assert_eq!(
        u32::from_be_bytes(reply[..4].try_into().unwrap()) & 0x7FFF_FFFF,
        frame.len() as u32 - 4
    );
    let body = &reply[4..];
    let word_b = |i: usize| u32::from_be_bytes(body[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!(
        (word_b(0), word_b(1), word_b(2)),
        (xid, 1, 0),
        "accepted reply to {xid}"
    );
    word_b(5)
}

#[test]
fn random_arguments_never_break_the_server() {
    let export = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"untouched").unwrap();
    std::fs::create_dir(export.path().join("d")).unwrap();
    std::fs::write(export.path().join("d/f"), b"data").unwrap();
    std::os::unix::fs::symlink(outside.path(), export.path().join("out")).unwrap();
    let fs = Arc::new(LocalFs::open(export.path()).unwrap());
    let programs = layerfs_nfs::programs(fs, export.path().as_os_str().as_encoded_bytes()).unwrap();
    let dispatcher = Dispatcher::new(programs);
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());

    // A real root handle, so mangled arguments get past the handle check.
    let mnt = call_record(1, 100_005, 1, &[0, 0, 0, 1, b'/', 0, 0, 0]);
    let Outcome::Reply(reply) = dispatcher.handle(&mnt, peer) else {
        panic!("MNT dropped")
    };
    let root_fh = reply.bytes()[4 + 28 + 4..4 + 28 + 4 + layerfs_nfs::FileHandle::LEN].to_vec();

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut xid = 10;
    for round in 0..6000 {
        let prog = if round % 7 == 0 { 100_005 } else { 100_003 };
        let proc = rng.below(24) as u32;
        let mut args = Vec::new();
        if rng.below(2) == 0 {
            // A valid handle, then random bytes: reaches the procedures' decoders.
            args.extend_from_slice(&(layerfs_nfs::FileHandle::LEN as u32).to_be_bytes());
            args.extend_from_slice(&root_fh);
            args.extend_from_slice(&[0, 0, 0]);
        }
        let len = rng.below(200) as usize;
        args.extend((0..len).map(|_| match rng.below(4) {
            0 => 0,
            1 => 0xFF,
            _ => rng.next() as u8,
        }));
        xid += 1;
        match dispatcher.handle(&call_record(xid, prog, proc, &args), peer) {
            Outcome::Reply(reply) | Outcome::ReplyThen(reply) => {
                let stat = accept_stat(&reply, xid);
                assert!(matches!(stat, 0 | 3 | 4), "proc {proc}: accept_stat {stat}");
            }
            Outcome::Dropped => panic!("a well-formed call was dropped"),
        }
    }
    assert_eq!(
        std::fs::read(outside.path().join("keep")).unwrap(),
        b"untouched"
    );
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        1,
        "nothing created outside"
    );
    // And it still serves: NULL and GETATTR of the root.
    let mut getattr = (layerfs_nfs::FileHandle::LEN as u32).to_be_bytes().to_vec();
    getattr.extend_from_slice(&root_fh);
    getattr.extend_from_slice(&[0, 0, 0]);
    let Outcome::Reply(reply) = dispatcher.handle(&call_record(1, 100_003, 1, &getattr), peer)
    else {
        panic!()
    };
    assert_eq!(accept_stat(&reply, 1), 0);
    assert_eq!(&reply.bytes()[28..32], &[0, 0, 0, 0], "GETATTR OK");
}
