//! One server, several exports: each mounted by its path, each handle
//! answered by its own export, a removed export's handles STALE.

use std::net::IpAddr;
use std::sync::Arc;

mod support;

use layerfs_nfs::{Export, Exports, FileHandle, HandleKey};
use layerfs_rpc::{Dispatcher, Outcome};
use layerfs_vfs::LocalFs;
use support::{call_record, xdr_opaque};

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;
const NFS3ERR_NOENT: u32 = 2;
const NFS3ERR_NOTDIR: u32 = 20;
const NFS3ERR_STALE: u32 = 70;
const NFS3ERR_BADHANDLE: u32 = 10001;

fn reply(d: &Dispatcher, record: &[u8]) -> Vec<u8> {
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let Outcome::Reply(reply) = d.handle(record, peer) else {
        panic!("no reply")
    };
    // Past the record mark, xid, REPLY, MSG_ACCEPTED, verifier and SUCCESS.
    reply.bytes()[4 + 24..].to_vec()
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(4)
        .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
        .collect()
}

/// MNT `path`: the status, and the handle on success.
fn mnt(d: &Dispatcher, path: &[u8]) -> Result<Vec<u8>, u32> {
    let body = reply(d, &call_record(1, MOUNT, 1, &xdr_opaque(path)));
    match words(&body[..4])[0] {
        0 => Ok(body[8..8 + FileHandle::LEN].to_vec()),
        status => Err(status),
    }
}

const KEY: HandleKey = HandleKey::from_bytes([3; 32]);

fn export_of(dir: &std::path::Path, id: u64, path: &[u8]) -> Export {
    Export {
        fs: Arc::new(LocalFs::open(dir).unwrap()),
        id,
        path: path.to_vec(),
        host_path: Vec::new(),
        squash: None,
        key: KEY,
        signed: Default::default(),
    }
}

/// LOOKUP `name` in `dir`: the status.
fn lookup_status(d: &Dispatcher, xid: u32, dir: &[u8], name: &[u8]) -> u32 {
    let mut args = xdr_opaque(dir);
    args.extend(xdr_opaque(name));
    words(&reply(d, &call_record(xid, NFS, 3, &args))[..4])[0]
}

#[test]
fn each_export_answers_its_own_handles() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(a.path().join("only-in-a"), b"a").unwrap();
    std::fs::write(b.path().join("only-in-b"), b"b").unwrap();
    let exports = Arc::new(Exports::new(KEY));
    exports.add(export_of(a.path(), 11, b"/a")).unwrap();
    exports.add(export_of(b.path(), 22, b"/b")).unwrap();
    let d = Dispatcher::new(layerfs_nfs::programs_of(exports.clone()));

    let root_a = mnt(&d, b"/a").unwrap();
    let root_b = mnt(&d, b"/b").unwrap();
    assert_ne!(root_a, root_b);
    assert_eq!(mnt(&d, b"/c"), Err(2), "no export: MNT3ERR_NOENT");
    assert_eq!(
        mnt(&d, b"/ab"),
        Err(2),
        "a path is matched by whole components"
    );

    assert_eq!(lookup_status(&d, 2, &root_a, b"only-in-a"), 0);
    assert_eq!(lookup_status(&d, 3, &root_a, b"only-in-b"), NFS3ERR_NOENT);
    assert_eq!(lookup_status(&d, 4, &root_b, b"only-in-b"), 0);

    // Removed, an export's handles are STALE, and the failure reply is
    // whole: status, then FALSE for the directory's attributes. A call
    // decoded before the removal and run after it (queued for a worker)
    // is STALE too.
    let mut args = xdr_opaque(&root_a);
    args.extend(xdr_opaque(b"only-in-a"));
    let queued = call_record(5, NFS, 3, &args);
    let routed = d.route(&queued);
    exports.remove(11).unwrap();
    let Outcome::Reply(frame) = d.answer(&routed, &queued, None) else {
        panic!("dropped")
    };
    assert_eq!(words(&frame.bytes()[4 + 24..]), [NFS3ERR_STALE, 0]);
    let body = reply(&d, &call_record(5, NFS, 3, &args));
    assert_eq!(words(&body), [NFS3ERR_STALE, 0]);
    assert_eq!(lookup_status(&d, 6, &root_b, b"only-in-b"), 0);

    // RENAME fails with two wcc_data: four FALSEs after the status.
    let mut args = xdr_opaque(&root_a);
    args.extend(xdr_opaque(b"x"));
    args.extend(xdr_opaque(&root_a));
    args.extend(xdr_opaque(b"y"));
    let body = reply(&d, &call_record(7, NFS, 14, &args));
    assert_eq!(words(&body), [NFS3ERR_STALE, 0, 0, 0, 0]);

    // A malformed handle is BADHANDLE whichever exports are served.
    let body = reply(&d, &call_record(8, NFS, 1, &xdr_opaque(&[9; 7])));
    assert_eq!(words(&body), [NFS3ERR_BADHANDLE]);

    // One signed with another key is BADHANDLE, for a served export or not;
    // one of ours, changed in any byte, too.
    let foreign = HandleKey::from_bytes([4; 32]);
    for export in [22, 11] {
        let h = FileHandle {
            export,
            fileid: 1,
            generation: 0,
        };
        let body = reply(&d, &call_record(9, NFS, 1, &xdr_opaque(&h.bytes(&foreign))));
        assert_eq!(words(&body), [NFS3ERR_BADHANDLE], "export {export}");
    }
    for at in [1, 9, 17, FileHandle::LEN - 1] {
        let mut forged = root_b.clone();
        forged[at] ^= 0x80;
        let body = reply(&d, &call_record(10, NFS, 1, &xdr_opaque(&forged)));
        assert_eq!(words(&body), [NFS3ERR_BADHANDLE], "byte {at} changed");
    }
}

#[test]
fn an_export_clashing_by_id_or_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let exports = Exports::new(KEY);
    let mut other_key = export_of(dir.path(), 3, b"/c");
    other_key.key = HandleKey::from_bytes([5; 32]);
    assert!(exports.add(other_key).is_err());
    exports.add(export_of(dir.path(), 1, b"/a")).unwrap();
    assert!(exports.add(export_of(dir.path(), 1, b"/b")).is_err());
    assert!(exports.add(export_of(dir.path(), 2, b"/a")).is_err());
    assert!(exports.add(export_of(dir.path(), 2, b"/b")).is_ok());
}

#[test]
fn a_directory_handle_of_another_generation_is_stale_for_lookup_and_listings() {
    // A directory whose id the host gave to a new directory: LOOKUP and
    // READDIR(PLUS) search or list the new one (the filesystem reads the
    // directory's attributes as it does) and must still answer STALE,
    // whether or not the name is there, and with no attributes of a
    // directory the client never saw.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("here"), b"x").unwrap();
    let exports = Arc::new(Exports::new(KEY));
    exports.add(export_of(dir.path(), 11, b"/")).unwrap();
    let d = Dispatcher::new(layerfs_nfs::programs_of(exports));
    let root = mnt(&d, b"/").unwrap();
    let h = FileHandle::decode(&root, 11, &KEY).unwrap();
    let earlier = FileHandle {
        generation: h.generation ^ 1,
        ..h
    }
    .bytes(&KEY);

    assert_eq!(lookup_status(&d, 2, &root, b"here"), 0);
    for (xid, name) in [(3, &b"here"[..]), (4, b"absent"), (5, b"."), (6, b"..")] {
        let mut args = xdr_opaque(&earlier);
        args.extend(xdr_opaque(name));
        let body = reply(&d, &call_record(xid, NFS, 3, &args));
        assert_eq!(words(&body), [NFS3ERR_STALE, 0], "{name:?}");
    }
    let listing_args = |dir: &[u8], plus: bool| {
        let mut args = xdr_opaque(dir);
        args.extend([0; 16]); // cookie 0, verifier 0
        args.extend(4096u32.to_be_bytes());
        if plus {
            args.extend(32768u32.to_be_bytes());
        }
        args
    };
    for (xid, proc) in [(8, 16), (9, 17)] {
        let body = reply(
            &d,
            &call_record(xid, NFS, proc, &listing_args(&earlier, proc == 17)),
        );
        assert_eq!(words(&body), [NFS3ERR_STALE, 0], "procedure {proc}");
        let body = reply(
            &d,
            &call_record(xid + 10, NFS, proc, &listing_args(&root, proc == 17)),
        );
        assert_eq!(
            words(&body[..8]),
            [0, 1],
            "procedure {proc} of the handle given out"
        );
    }
    // A file's handle: NOTDIR, with the file's attributes.
    let mut args = xdr_opaque(&root);
    args.extend(xdr_opaque(b"here"));
    let body = reply(&d, &call_record(10, NFS, 3, &args));
    let file = body[8..8 + FileHandle::LEN].to_vec();
    for (xid, proc) in [(11, 16), (12, 17)] {
        let body = reply(
            &d,
            &call_record(xid, NFS, proc, &listing_args(&file, proc == 17)),
        );
        assert_eq!(words(&body[..8]), [NFS3ERR_NOTDIR, 1], "procedure {proc}");
        assert_eq!(body.len(), 8 + 84);
    }

    // The handle as given out: a missing name is NOENT with the directory's
    // attributes (TRUE, then a fattr3 of 84 bytes).
    let mut args = xdr_opaque(&root);
    args.extend(xdr_opaque(b"absent"));
    let body = reply(&d, &call_record(7, NFS, 3, &args));
    assert_eq!(words(&body[..8]), [NFS3ERR_NOENT, 1]);
    assert_eq!(body.len(), 8 + 84);
}
