//! Every NFS and MOUNT procedure's argument decoder, and the procedure
//! behind it, through the dispatcher over a real directory: any bytes after
//! a real handle (or none) get a reply that is an accepted or denied RPC
//! reply with the call's xid, and nothing panics or escapes the export.
#![no_main]

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use layerfs_rpc::{Dispatcher, Outcome};
use libfuzzer_sys::fuzz_target;

struct Served {
    dispatcher: Dispatcher,
    root: Vec<u8>,
    _dir: tempfile::TempDir,
}

fn call(xid: u32, prog: u32, proc: u32, args: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    // AUTH_SYS as uid/gid 1000, empty machine name, no groups.
    for w in [xid, 0, 2, prog, 3, proc, 1, 20, 0, 0, 1000, 1000, 0, 0, 0] {
        out.extend_from_slice(&w.to_be_bytes());
    }
    out.extend_from_slice(args);
    out
}

fn served() -> &'static Served {
    static SERVED: OnceLock<Served> = OnceLock::new();
    SERVED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f"), b"data").unwrap();
        let fs = Arc::new(layerfs_vfs::LocalFs::open(dir.path()).unwrap());
        let dispatcher = Dispatcher::new(layerfs_nfs::programs(fs, b"/").unwrap());
        let Outcome::Reply(reply) =
            dispatcher.handle(&call(1, 100_005, 1, &[0, 0, 0, 1, b'/', 0, 0, 0]), None)
        else {
            panic!("MNT")
        };
        let len = layerfs_nfs::FileHandle::LEN;
        let root = reply.bytes()[4 + 24 + 8..4 + 24 + 8 + len].to_vec();
        Served {
            dispatcher,
            root,
            _dir: dir,
        }
    })
}

fuzz_target!(|input: (u8, bool, &[u8])| {
    let (selector, with_handle, rest) = input;
    let s = served();
    let (prog, proc) = if selector & 0x80 != 0 {
        (100_005, u32::from(selector & 0x07))
    } else {
        (100_003, u32::from(selector % 23))
    };
    let mut args = Vec::new();
    if with_handle {
        args.extend_from_slice(&(s.root.len() as u32).to_be_bytes());
        args.extend_from_slice(&s.root);
        args.resize(layerfs_rpc::xdr::padded(args.len()), 0);
    }
    args.extend_from_slice(rest);
    let xid = 0xC0FF_EE00 | u32::from(selector);
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let record = call(xid, prog, proc, &args);
    // As the server does: one route (the envelope and the arguments
    // decoded), the placement, the call.
    let routed = s.dispatcher.route(&record);
    let _ = routed.placement();
    let outcome = s.dispatcher.answer(&routed, &record, peer);
    let call_back = matches!(outcome, Outcome::ReplyThen(_));
    match outcome {
        Outcome::Reply(reply) | Outcome::ReplyThen(reply) => {
            let bytes = reply.bytes();
            assert!(bytes.len() >= 4 + 12, "a reply too short");
            assert_eq!(bytes[4..8], xid.to_be_bytes(), "the call's xid");
            assert_eq!(bytes[8..12], [0, 0, 0, 1], "a REPLY");
        }
        Outcome::Dropped => {}
    }
    if call_back {
        s.dispatcher.after_reply(&routed, &record, peer);
    }
});
