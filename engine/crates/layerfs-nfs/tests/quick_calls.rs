//! Which calls run on the connection's reader thread: quick metadata reads
//! on files the filesystem already knows. A handle from before a restart
//! may need a walk of the whole export, so its call goes to a worker and
//! the calls behind it on the connection are not held up.

use std::net::IpAddr;
use std::sync::Arc;

mod support;

use layerfs_rpc::{Dispatcher, Outcome};
use layerfs_vfs::LocalFs;
use support::{call_record, xdr_opaque};

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;

/// A server on `dir` with the key a store would keep across restarts.
fn dispatcher(dir: &std::path::Path) -> Dispatcher {
    let fs = Arc::new(LocalFs::open(dir).unwrap());
    let mut export = layerfs_nfs::Export::new(fs, dir.as_os_str().as_encoded_bytes()).unwrap();
    export.key = layerfs_nfs::HandleKey::from_bytes([7; 32]);
    Dispatcher::new(layerfs_nfs::programs_for(export))
}

/// The handle that a MNT or LOOKUP reply carries first.
fn handle_in(d: &Dispatcher, record: &[u8]) -> Vec<u8> {
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let Outcome::Reply(reply) = d.handle(record, peer) else {
        panic!("dropped")
    };
    let body = &reply.bytes()[4 + 24..];
    assert_eq!(body[..4], [0, 0, 0, 0], "status");
    assert_eq!(body[4..8], [0, 0, 0, 41], "handle length");
    body[8..8 + layerfs_nfs::FileHandle::LEN].to_vec()
}

#[test]
fn a_call_on_a_handle_not_yet_known_goes_to_a_worker() {
    let export = tempfile::tempdir().unwrap();
    std::fs::create_dir(export.path().join("d")).unwrap();
    std::fs::write(export.path().join("d/f"), b"data").unwrap();
    let d = dispatcher(export.path());
    let root = handle_in(&d, &call_record(1, MOUNT, 1, &xdr_opaque(b"/")));
    let mut lookup = xdr_opaque(&root);
    lookup.extend(xdr_opaque(b"d"));
    let dir = handle_in(&d, &call_record(2, NFS, 3, &lookup));
    let mut lookup = xdr_opaque(&dir);
    lookup.extend(xdr_opaque(b"f"));
    let file = handle_in(&d, &call_record(3, NFS, 3, &lookup));
    let getattr = |fh: &[u8]| call_record(4, NFS, 1, &xdr_opaque(fh));
    assert!(d.is_quick(&call_record(5, NFS, 0, &[])), "NULL");
    assert!(d.is_quick(&getattr(&root)));
    assert!(d.is_quick(&getattr(&file)));
    let mut write = xdr_opaque(&file);
    write.extend([0; 8].iter().chain(&[0, 0, 0, 1, 0, 0, 0, 2]));
    write.extend(xdr_opaque(b"x"));
    assert!(!d.is_quick(&call_record(6, NFS, 7, &write)), "WRITE");
    // A restart: the file's handle is unknown until a walk finds it.
    let d = dispatcher(export.path());
    assert!(d.is_quick(&getattr(&root)));
    assert!(!d.is_quick(&getattr(&file)));
    assert!(
        !d.is_quick(&call_record(7, NFS, 4, &xdr_opaque(&dir))),
        "ACCESS"
    );
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    d.handle(&getattr(&file), peer);
    assert!(d.is_quick(&getattr(&file)), "found by the walk");
    // Garbage is answered from the envelope at once.
    assert!(d.is_quick(&getattr(&[1, 2, 3])));
}
