//! Every NFS procedure but NULL needs a credential that names its caller;
//! with --squash every caller is one identity.

use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;

mod support;

use layerfs_nfs::Export;
use layerfs_rpc::{Dispatcher, Outcome};
use layerfs_vfs::LocalFs;
use support::{call_record, xdr_opaque};

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;

/// A call with an AUTH_NONE credential.
fn anonymous(xid: u32, proc: u32, args: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for w in [xid, 0, 2, NFS, 3, proc, 0, 0, 0, 0] {
        out.extend_from_slice(&w.to_be_bytes());
    }
    out.extend_from_slice(args);
    out
}

/// The reply's words after the xid: message type, reply status, and the two after.
fn reply_words(d: &Dispatcher, record: &[u8]) -> Vec<u32> {
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let Outcome::Reply(reply) = d.handle(record, peer) else {
        panic!("no reply")
    };
    reply.bytes()[8..]
        .chunks(4)
        .take(4)
        .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
        .collect()
}

fn root_handle(d: &Dispatcher) -> Vec<u8> {
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let Outcome::Reply(mnt) = d.handle(&call_record(1, MOUNT, 1, &xdr_opaque(b"/")), peer) else {
        panic!("MNT");
    };
    mnt.bytes()[4 + 24 + 8..4 + 24 + 8 + layerfs_nfs::FileHandle::LEN].to_vec()
}

#[test]
fn a_call_without_a_caller_gets_only_null() {
    let export = tempfile::tempdir().unwrap();
    let fs = Arc::new(LocalFs::open(export.path()).unwrap());
    let d = Dispatcher::new(layerfs_nfs::programs(fs, b"/").unwrap());
    let root = root_handle(&d);
    // REPLY, MSG_DENIED, AUTH_ERROR, AUTH_TOOWEAK
    assert_eq!(
        reply_words(&d, &anonymous(2, 1, &xdr_opaque(&root))),
        [1, 1, 1, 5]
    );
    // REPLY, MSG_ACCEPTED, verifier AUTH_NONE (flavor, length), then SUCCESS
    assert_eq!(reply_words(&d, &anonymous(3, 0, &[]))[..2], [1, 0]);
    assert_eq!(
        reply_words(&d, &call_record(4, NFS, 1, &xdr_opaque(&root)))[..2],
        [1, 0]
    );
}

#[test]
fn with_a_squash_every_caller_is_one_identity() {
    if !rustix::process::geteuid().is_root() {
        layerfs_testkit::skip_or_fail("squash", "making files as another user needs root");
        return;
    }
    let export = tempfile::tempdir().unwrap();
    // Checked as the squashed user, root's own 0700 directory is closed.
    std::fs::set_permissions(export.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let fs = Arc::new(LocalFs::open(export.path()).unwrap());
    let mut squashed = Export::new(fs, b"/").unwrap();
    squashed.squash = Some((4321, 8765));
    let d = Dispatcher::new(layerfs_nfs::programs_for(squashed));
    let root = root_handle(&d);
    // MKDIR "d" as root (the record's credential is uid 0), mode 0777.
    let mut mkdir = xdr_opaque(&root);
    mkdir.extend(xdr_opaque(b"d"));
    // sattr3: mode set to 0777; uid, gid, size, atime, mtime not set.
    mkdir.extend(1u32.to_be_bytes());
    mkdir.extend(0o777u32.to_be_bytes());
    mkdir.extend([0u8; 4 * 5]);
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    d.handle(&call_record(2, NFS, 9, &mkdir), peer);
    let made = std::fs::metadata(export.path().join("d")).unwrap();
    assert_eq!((made.uid(), made.gid()), (4321, 8765));
}
