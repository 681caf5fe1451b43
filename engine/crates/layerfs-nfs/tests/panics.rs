//! A procedure that panics costs one reply, not the server: SYSTEM_ERR for
//! that call, no reply-cache entry left behind (its retransmission runs
//! afresh at once instead of waiting for results that never come), no lock
//! left poisoned, and every later call answered.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use layerfs_rpc::{Dispatcher, Outcome};
use layerfs_vfs::{
    Attr, Caller, Change, Create, DirPage, FileId, Filesystem, FsStat, LocalFs, NewEntry, Result,
    SetAttr, Stability, Timestamp,
};
use support::{call_record, xdr_opaque};

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;

/// `LocalFs`, but the next CREATE panics while it holds `held` (a lock of
/// the kind every filesystem here uses), once armed.
struct PanicsOnCreate {
    inner: LocalFs,
    armed: AtomicBool,
    held: parking_lot::Mutex<()>,
}

impl Filesystem for PanicsOnCreate {
    fn root(&self) -> FileId {
        self.inner.root()
    }
    fn getattr(&self, id: FileId) -> Result<Attr> {
        let _held = self.held.lock();
        self.inner.getattr(id)
    }
    fn setattr(&self, c: &Caller, id: FileId, s: &SetAttr, g: Option<Timestamp>) -> Result<Change> {
        self.inner.setattr(c, id, s, g)
    }
    fn lookup_in(&self, c: &Caller, dir: FileId, name: &[u8]) -> Result<(Result<Attr>, Attr)> {
        self.inner.lookup_in(c, dir, name)
    }
    fn readlink(&self, c: &Caller, id: FileId) -> Result<Vec<u8>> {
        self.inner.readlink(c, id)
    }
    fn read(
        &self,
        c: &Caller,
        id: FileId,
        off: u64,
        n: usize,
        dst: &mut Vec<u8>,
    ) -> Result<(bool, Attr)> {
        self.inner.read(c, id, off, n, dst)
    }
    fn write(
        &self,
        c: &Caller,
        id: FileId,
        off: u64,
        d: &[u8],
        s: Stability,
    ) -> Result<(Change, Stability)> {
        self.inner.write(c, id, off, d, s)
    }
    fn commit(&self, id: FileId) -> Result<Change> {
        self.inner.commit(id)
    }
    fn create(&self, c: &Caller, dir: FileId, name: &[u8], how: Create) -> Result<(Attr, Change)> {
        let _held = self.held.lock();
        if self.armed.swap(false, SeqCst) {
            panic!("a bug in CREATE");
        }
        self.inner.create(c, dir, name, how)
    }
    fn make(
        &self,
        c: &Caller,
        dir: FileId,
        name: &[u8],
        what: NewEntry<'_>,
        s: &SetAttr,
    ) -> Result<(Attr, Change)> {
        self.inner.make(c, dir, name, what, s)
    }
    fn remove(&self, c: &Caller, dir: FileId, name: &[u8]) -> Result<Change> {
        self.inner.remove(c, dir, name)
    }
    fn rmdir(&self, c: &Caller, dir: FileId, name: &[u8]) -> Result<Change> {
        self.inner.rmdir(c, dir, name)
    }
    fn rename(
        &self,
        c: &Caller,
        from: FileId,
        fname: &[u8],
        to: FileId,
        tname: &[u8],
    ) -> Result<(Change, Change)> {
        self.inner.rename(c, from, fname, to, tname)
    }
    fn link(&self, c: &Caller, id: FileId, dir: FileId, name: &[u8]) -> Result<(Attr, Change)> {
        self.inner.link(c, id, dir, name)
    }
    fn readdir(
        &self,
        c: &Caller,
        dir: FileId,
        cookie: u64,
        max: usize,
        attrs: bool,
    ) -> Result<DirPage> {
        self.inner.readdir(c, dir, cookie, max, attrs)
    }
    fn fsstat(&self, id: FileId) -> Result<FsStat> {
        self.inner.fsstat(id)
    }
}

/// The reply's accept status and the NFS status after it.
fn statuses(d: &Dispatcher, record: &[u8]) -> (u32, Option<u32>) {
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let Outcome::Reply(reply) = d.handle(record, peer) else {
        panic!("no reply")
    };
    let word = |at: usize| {
        let b = reply.bytes().get(4 + at..4 + at + 4)?;
        Some(u32::from_be_bytes(b.try_into().unwrap()))
    };
    (word(20).unwrap(), word(24))
}

#[test]
fn a_panicking_create_is_answered_once_and_its_retransmission_runs() {
    let export = tempfile::tempdir().unwrap();
    let fs = Arc::new(PanicsOnCreate {
        inner: LocalFs::open(export.path()).unwrap(),
        armed: AtomicBool::new(false),
        held: parking_lot::Mutex::new(()),
    });
    let d = Dispatcher::new(layerfs_nfs::programs(fs.clone(), b"/").unwrap());
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let Outcome::Reply(mnt) = d.handle(&call_record(1, MOUNT, 1, &xdr_opaque(b"/")), peer) else {
        panic!("MNT");
    };
    let root = mnt.bytes()[4 + 24 + 8..4 + 24 + 8 + layerfs_nfs::FileHandle::LEN].to_vec();
    // CREATE "f", UNCHECKED, no attributes.
    let mut create = xdr_opaque(&root);
    create.extend(xdr_opaque(b"f"));
    create.extend([0u8; 4 + 6 * 4]);
    let call = call_record(2, NFS, 8, &create);

    fs.armed.store(true, SeqCst);
    assert_eq!(statuses(&d, &call).0, 5, "SYSTEM_ERR for the panic");
    let started = Instant::now();
    assert_eq!(statuses(&d, &call), (0, Some(0)), "the retransmission runs");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "it did not wait"
    );
    assert!(export.path().join("f").exists());
    // The lock held through the panic still works, and so does the server.
    assert_eq!(
        statuses(&d, &call_record(3, NFS, 1, &xdr_opaque(&root))),
        (0, Some(0))
    );
}
