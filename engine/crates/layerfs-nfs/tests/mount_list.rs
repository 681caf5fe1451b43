//! MOUNT's list of mounts (DUMP): each client's mount once, and bounded,
//! however many MNTs arrive without a UMNT.

use std::net::IpAddr;
use std::sync::Arc;

mod support;

use layerfs_rpc::{Dispatcher, Outcome};
use layerfs_vfs::LocalFs;
use support::{call_record, xdr_opaque};

const MOUNT: u32 = 100_005;

/// How many mounts a DUMP lists.
fn dumped(d: &Dispatcher, peer: Option<IpAddr>) -> usize {
    let Outcome::Reply(reply) = d.handle(&call_record(9, MOUNT, 2, &[]), peer) else {
        panic!("DUMP dropped")
    };
    // mountlist: (value follows: 1, hostname, directory)* then 0.
    let mut body = &reply.bytes()[4 + 24..];
    let mut n = 0;
    let word = |b: &[u8]| u32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
    while word(body) == 1 {
        n += 1;
        let host = layerfs_rpc::xdr::padded(word(&body[4..]));
        let dir = layerfs_rpc::xdr::padded(word(&body[8 + host..]));
        body = &body[12 + host + dir..];
    }
    n
}

#[test]
fn the_mount_list_keeps_each_mount_once_and_stays_bounded() {
    let export = tempfile::tempdir().unwrap();
    let fs = Arc::new(LocalFs::open(export.path()).unwrap());
    let d = Dispatcher::new(layerfs_nfs::programs(fs, b"/").unwrap());
    let one: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    for xid in 0..1000 {
        d.handle(&call_record(xid, MOUNT, 1, &xdr_opaque(b"/")), one);
    }
    assert_eq!(dumped(&d, one), 1, "a client that never unmounts");
    for i in 0..1000u32 {
        let peer: Option<IpAddr> = Some(
            format!("127.0.{}.{}", i / 250, i % 250 + 1)
                .parse()
                .unwrap(),
        );
        d.handle(&call_record(i, MOUNT, 1, &xdr_opaque(b"/")), peer);
    }
    assert_eq!(dumped(&d, one), 256, "bounded");
}
