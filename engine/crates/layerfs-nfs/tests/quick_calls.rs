//! Which calls run on the connection's reader thread: quick metadata reads
//! on files the filesystem already knows, and single-entry changes while the
//! connection is idle. A handle from before a restart may need a walk of the
//! whole export, and a change in a layered workspace a copy-up: such calls
//! go to a worker and the calls behind them on the connection are not held
//! up.

use std::net::IpAddr;
use std::sync::Arc;

mod support;

use layerfs_rpc::{Dispatcher, Outcome, Placement};
use layerfs_vfs::{Filesystem, LocalFs};
use support::{call_record, xdr_opaque};

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;

/// A server on `dir` with the key a store would keep across restarts.
fn dispatcher(dir: &std::path::Path) -> Dispatcher {
    dispatcher_of(Arc::new(LocalFs::open(dir).unwrap()), dir)
}

fn dispatcher_of(fs: Arc<dyn Filesystem>, dir: &std::path::Path) -> Dispatcher {
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
    let on = |record: &[u8]| d.route(record).placement();
    assert_eq!(on(&call_record(5, NFS, 0, &[])), Placement::Reader, "NULL");
    assert_eq!(on(&getattr(&root)), Placement::Reader);
    assert_eq!(on(&getattr(&file)), Placement::Reader);
    assert_eq!(on(&write(&file, 2, 1)), Placement::Worker, "FILE_SYNC");
    assert_eq!(on(&write(&file, 0, 1)), Placement::ReaderWhenIdle);
    assert_eq!(
        on(&write(&file, 0, 1 << 20)),
        Placement::ReaderWhenIdle,
        "1 MiB"
    );
    assert_eq!(
        on(&write(&file, 0, (1 << 20) + 1)),
        Placement::Worker,
        "past wtmax"
    );
    assert_eq!(on(&create(&dir, b"g")), Placement::Reader);
    assert_eq!(on(&rename(&dir, &root)), Placement::Reader);
    assert_eq!(on(&setattr(&file)), Placement::Reader, "chmod");
    assert_eq!(on(&truncate(&file)), Placement::ReaderWhenIdle);
    // COMMIT3args: the file, an offset and a count.
    let commit = [xdr_opaque(&file), vec![0; 12]].concat();
    assert_eq!(
        on(&call_record(6, NFS, 21, &commit)),
        Placement::Worker,
        "COMMIT"
    );
    // A restart: the file's handle is unknown until a walk finds it.
    let d = dispatcher(export.path());
    let on = |record: &[u8]| d.route(record).placement();
    assert_eq!(on(&getattr(&root)), Placement::Reader);
    assert_eq!(on(&getattr(&file)), Placement::Worker);
    assert_eq!(
        on(&call_record(
            7,
            NFS,
            4,
            &[xdr_opaque(&dir), vec![0, 0, 0, 1]].concat()
        )),
        Placement::Worker,
        "ACCESS"
    );
    assert_eq!(on(&create(&dir, b"g")), Placement::Worker);
    assert_eq!(
        on(&rename(&root, &dir)),
        Placement::Worker,
        "the second handle"
    );
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    d.handle(&getattr(&file), peer);
    assert_eq!(on(&getattr(&file)), Placement::Reader, "found by the walk");
    // Garbage is answered from the envelope at once.
    assert_eq!(on(&getattr(&[1, 2, 3])), Placement::Reader);
}

#[test]
fn in_a_layered_workspace_only_changes_that_copy_nothing_up_run_on_the_reader() {
    let (lower, upper) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(lower.path().join("f"), b"data").unwrap();
    let stack = layerfs_layers::StackFs::open_in_upper(&[lower.path().to_owned()], upper.path());
    let stack = Arc::new(stack.unwrap());
    let d = dispatcher_of(stack.clone(), upper.path());
    let root = handle_in(&d, &call_record(1, MOUNT, 1, &xdr_opaque(b"/")));
    let mut lookup = xdr_opaque(&root);
    lookup.extend(xdr_opaque(b"f"));
    let file = handle_in(&d, &call_record(2, NFS, 3, &lookup));
    let on = |record: &[u8]| d.route(record).placement();
    assert_eq!(on(&create(&root, b"g")), Placement::Reader);
    assert_eq!(
        on(&call_record(3, NFS, 12, &lookup)),
        Placement::Worker,
        "REMOVE of a lower file: if hard-linked, its other names copy it up"
    );
    assert_eq!(on(&write(&file, 0, 1)), Placement::Worker, "a copy-up");
    assert_eq!(on(&setattr(&file)), Placement::Worker, "a copy-up");
    // The root merges with the lower root, whose entries the LOOKUP read:
    // a RENAME of a name no lower layer holds copies nothing up.
    assert_eq!(on(&rename(&root, &root)), Placement::Reader);
    assert_eq!(
        on(&rename_names(&root, b"f", &root, b"b")),
        Placement::Worker,
        "a lower file"
    );
    assert_eq!(
        on(&rename_names(&root, b"a", &root, b"f")),
        Placement::Worker,
        "over a lower file"
    );
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let ran = |record: &[u8]| {
        let Outcome::Reply(reply) = d.handle(record, peer) else {
            panic!("dropped")
        };
        assert_eq!(reply.bytes()[4 + 24..][..4], [0, 0, 0, 0], "status");
    };
    ran(&write(&file, 0, 1));
    assert_eq!(
        on(&write(&file, 0, 1)),
        Placement::ReaderWhenIdle,
        "copied up"
    );
    assert_eq!(on(&setattr(&file)), Placement::Reader, "copied up");
    // A directory made in the workspace has no lower part: nothing in it is
    // copied up by a change.
    let mut mkdir = xdr_opaque(&root);
    mkdir.extend(xdr_opaque(b"new"));
    mkdir.extend([0; 24]);
    ran(&call_record(4, NFS, 9, &mkdir));
    let mut lookup = xdr_opaque(&root);
    lookup.extend(xdr_opaque(b"new"));
    let new = handle_in(&d, &call_record(5, NFS, 3, &lookup));
    ran(&create(&new, b"a"));
    assert_eq!(on(&rename(&new, &new)), Placement::Reader);
    assert_eq!(on(&rename(&new, &root)), Placement::Reader);
    assert_eq!(
        on(&rename_names(&new, b"a", &root, b"f")),
        Placement::Worker,
        "over a lower file"
    );
    // A commit turns the upper into a layer: its files are lower again.
    let next = tempfile::tempdir_in(upper.path().parent().unwrap()).unwrap();
    stack.commit_upper(next.path(), &[], |_| Ok(())).unwrap();
    assert_eq!(on(&write(&file, 0, 1)), Placement::Worker, "committed");
    assert_eq!(on(&rename(&new, &new)), Placement::Worker, "committed");
    assert_eq!(on(&rename(&root, &root)), Placement::Worker, "committed");
}

/// A listing runs on the reader only once the directory was listed lately
/// and its entries' attributes are kept: a cold one could read thousands of
/// inodes from disk while the connection's other calls wait.
#[test]
fn a_listing_runs_on_the_reader_only_when_kept() {
    let export = tempfile::tempdir().unwrap();
    for d in ["files", "dirs"] {
        std::fs::create_dir(export.path().join(d)).unwrap();
    }
    for i in 0..100 {
        std::fs::write(export.path().join(format!("files/f{i}")), b"x").unwrap();
        // Directories' attributes are never kept: read at every listing.
        std::fs::create_dir(export.path().join(format!("dirs/d{i}"))).unwrap();
    }
    // A listing is kept once its directory has not changed for a while.
    std::thread::sleep(std::time::Duration::from_millis(120));
    let d = dispatcher(export.path());
    let root = handle_in(&d, &call_record(1, MOUNT, 1, &xdr_opaque(b"/")));
    let on = |record: &[u8]| d.route(record).placement();
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    for name in [&b"files"[..], b"dirs"] {
        let mut lookup = xdr_opaque(&root);
        lookup.extend(xdr_opaque(name));
        let dir = handle_in(&d, &call_record(2, NFS, 3, &lookup));
        assert_eq!(on(&readdir(&dir)), Placement::Worker, "not listed yet");
        assert_eq!(on(&readdirplus(&dir)), Placement::Worker, "not listed yet");
        let Outcome::Reply(_) = d.handle(&readdirplus(&dir), peer) else {
            panic!("dropped")
        };
        assert_eq!(on(&readdir(&dir)), Placement::ReaderWhenIdle, "listed");
        let plus = if name == b"files" {
            Placement::ReaderWhenIdle
        } else {
            Placement::Worker
        };
        assert_eq!(on(&readdirplus(&dir)), plus, "{:?}", name);
    }
    // A workspace: lower files' attributes are kept once listed.
    let (lower, upper) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for i in 0..100 {
        std::fs::write(lower.path().join(format!("f{i}")), b"x").unwrap();
    }
    let stack = layerfs_layers::StackFs::open_in_upper(&[lower.path().to_owned()], upper.path());
    let d = dispatcher_of(Arc::new(stack.unwrap()), upper.path());
    let root = handle_in(&d, &call_record(1, MOUNT, 1, &xdr_opaque(b"/")));
    let on = |record: &[u8]| d.route(record).placement();
    assert_eq!(on(&readdirplus(&root)), Placement::Worker, "not listed yet");
    let Outcome::Reply(_) = d.handle(&readdir(&root), peer) else {
        panic!("dropped")
    };
    assert_eq!(on(&readdir(&root)), Placement::ReaderWhenIdle);
    assert_eq!(
        on(&readdirplus(&root)),
        Placement::Worker,
        "no attributes kept"
    );
    // The first listing with attributes reads them from the host; the next
    // finds them kept.
    for runs in [Placement::Worker, Placement::ReaderWhenIdle] {
        let Outcome::Reply(_) = d.handle(&readdirplus(&root), peer) else {
            panic!("dropped")
        };
        assert_eq!(on(&readdirplus(&root)), runs);
    }
}

/// READDIR from cookie 0 with room for 64 KiB.
fn readdir(dir: &[u8]) -> Vec<u8> {
    let mut args = xdr_opaque(dir);
    args.extend([0; 16]);
    args.extend(65_536u32.to_be_bytes());
    call_record(11, NFS, 16, &args)
}

/// READDIRPLUS from cookie 0 with room for all of a small directory.
fn readdirplus(dir: &[u8]) -> Vec<u8> {
    let mut args = xdr_opaque(dir);
    args.extend([0; 16]);
    args.extend(
        65_536u32
            .to_be_bytes()
            .iter()
            .chain(&(1u32 << 20).to_be_bytes()),
    );
    call_record(12, NFS, 17, &args)
}

/// SETATTR of mode 0600.
fn setattr(fh: &[u8]) -> Vec<u8> {
    let mut args = xdr_opaque(fh);
    args.extend(1u32.to_be_bytes().iter().chain(&0o600u32.to_be_bytes()));
    args.extend([0; 20]);
    args.extend([0; 4]);
    call_record(10, NFS, 2, &args)
}

/// SETATTR of the size to 0 (a truncation), no guard.
fn truncate(fh: &[u8]) -> Vec<u8> {
    let mut args = xdr_opaque(fh);
    args.extend([0; 12]);
    args.extend(1u32.to_be_bytes().iter().chain(&[0; 8]));
    args.extend([0; 8]);
    args.extend([0; 4]);
    call_record(11, NFS, 2, &args)
}

/// WRITE of `count` zero bytes at offset 0, `stable` as RFC 1813 numbers it.
fn write(fh: &[u8], stable: u32, count: u32) -> Vec<u8> {
    let mut args = xdr_opaque(fh);
    args.extend([0; 8]);
    args.extend(count.to_be_bytes().iter().chain(&stable.to_be_bytes()));
    args.extend(xdr_opaque(&vec![0; count as usize]));
    call_record(6, NFS, 7, &args)
}

/// CREATE UNCHECKED of `name` with no attributes set.
fn create(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut args = xdr_opaque(dir);
    args.extend(xdr_opaque(name));
    args.extend([0; 4]);
    args.extend([0; 24]);
    call_record(8, NFS, 8, &args)
}

/// RENAME of `a` in `from` to `b` in `to`.
fn rename(from: &[u8], to: &[u8]) -> Vec<u8> {
    rename_names(from, b"a", to, b"b")
}

fn rename_names(from: &[u8], a: &[u8], to: &[u8], b: &[u8]) -> Vec<u8> {
    let mut args = xdr_opaque(from);
    args.extend(xdr_opaque(a));
    args.extend(xdr_opaque(to));
    args.extend(xdr_opaque(b));
    call_record(9, NFS, 14, &args)
}
