//! The requests a CPU's ring answers without fuser ([`crate::uring`]), read
//! from and answered into the ring's buffers as the kernel lays them out
//! (`include/uapi/linux/fuse.h`). No I/O here: a request in, an answer out.
//!
//! Those are the requests every file copied in, removed or first appended
//! to costs (LOOKUP, CREATE, GETXATTR of `security.capability`, RELEASE,
//! the directory's GETATTR, UNLINK, OPEN, FLUSH, and the SETATTR of times
//! the kernel's writeback cache sends after a write and an unlink), and
//! READ and WRITE, whose data would otherwise be copied twice more; the
//! ring hands any other to a fuser session.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, OpenFlags, TimeOrNow,
    WriteFlags,
};
use layerfs_vfs::SetAttr;

use zerocopy::IntoBytes;

use crate::abi::{
    self, Attr, AttrOut, CreateIn, EntryOut, GetxattrIn, GetxattrOut, OpenIn, OpenOut, ReadIn,
    ReleaseIn, SetattrIn, WriteIn, WriteOut,
};
pub use crate::abi::{InHeader, OutHeader};
use crate::answer::{
    Answer, AttrAnswer, CreateAnswer, DataAnswer, EmptyAnswer, EntryAnswer, OpenAnswer,
    WriteAnswer, XattrAnswer,
};
use crate::backing::Backing;
use crate::door::{set_time, Door, Who};
use crate::opens::Registered;

const LOOKUP: u32 = 1;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const UNLINK: u32 = 10;
const OPEN: u32 = 14;
pub const READ: u32 = 15;
const WRITE: u32 = 16;
const RELEASE: u32 = 18;
const GETXATTR: u32 = 22;
const FLUSH: u32 = 25;
const CREATE: u32 = 35;

/// `struct fuse_in_header`'s length.
pub const IN_HEADER_LEN: usize = std::mem::size_of::<InHeader>();
/// `struct fuse_out_header`'s length.
pub const OUT_HEADER_LEN: usize = std::mem::size_of::<OutHeader>();

/// One answer: an error, or a body (possibly empty).
#[derive(Debug, Default)]
pub struct Answered {
    /// Negative errno, or 0.
    pub error: i32,
    pub body: Vec<u8>,
}

/// The out header of an answer of `body` bytes, or of error `error`
/// (negative).
pub fn out_header(unique: u64, error: i32, body: usize) -> OutHeader {
    OutHeader {
        len: (OUT_HEADER_LEN + body) as u32,
        error,
        unique,
    }
}

/// The offset and size of a READ, if `op` holds its arguments.
pub fn read_in(op: &[u8]) -> Option<(u64, u32)> {
    abi::args::<ReadIn>(op).map(|r| (r.offset, r.size))
}

/// `FATTR_*`: which fields of `struct fuse_setattr_in` to set.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;

/// What a SETATTR asks to set, as fuser reads it: the change time, the
/// file handle and FATTR_KILL_SUIDGID are not the door's to use.
fn setattr_in(op: &SetattrIn) -> SetAttr {
    let has = |bit: u32| op.valid & bit != 0;
    let time = |bit: u32, now: u32, secs: u64, nanos: u32| {
        set_time(has(bit).then(|| match has(now) {
            true => TimeOrNow::Now,
            false => TimeOrNow::SpecificTime(system_time(secs as i64, nanos)),
        }))
    };
    SetAttr {
        mode: has(FATTR_MODE).then_some(op.mode),
        uid: has(FATTR_UID).then_some(op.uid),
        gid: has(FATTR_GID).then_some(op.gid),
        size: has(FATTR_SIZE).then_some(op.size),
        atime: time(FATTR_ATIME, FATTR_ATIME_NOW, op.atime, op.atimensec),
        mtime: time(FATTR_MTIME, FATTR_MTIME_NOW, op.mtime, op.mtimensec),
    }
}

/// Answers `h` (its operation's header `op`, then `payload`) with `door`
/// into `out`, if it is a request the ring answers itself; false, with
/// `out` empty, for any other.
pub fn answer(door: &Door, h: &InHeader, op: &[u8], payload: &[u8], out: &mut Answered) -> bool {
    out.error = 0;
    out.body.clear();
    let who = Who {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    let ino = INodeNo(h.nodeid);
    // Extensions follow the arguments; none of these requests reads them.
    let args = &payload[..payload
        .len()
        .saturating_sub(8 * usize::from(h.total_extlen))];
    let reply = Reply(out);
    match h.opcode {
        LOOKUP => match name(args) {
            Some(name) => door.lookup_as(who, ino, name, reply),
            None => reply.error(Errno::EINVAL),
        },
        GETATTR => door.getattr_as(ino, reply),
        SETATTR => match abi::args::<SetattrIn>(op) {
            Some(set) => door.setattr_as(who, ino, setattr_in(&set), reply),
            None => reply.error(Errno::EIO),
        },
        UNLINK => match name(args) {
            Some(name) => door.unlink_as(who, ino, name, reply),
            None => reply.error(Errno::EINVAL),
        },
        OPEN => match abi::args::<OpenIn>(op) {
            Some(open) => door.open_as(who, ino, OpenFlags(open.flags as i32), reply),
            None => reply.error(Errno::EIO),
        },
        READ => match abi::args::<ReadIn>(op) {
            Some(read) => door.read_as(ino, read.offset, read.size, reply),
            None => reply.error(Errno::EIO),
        },
        // The data is the payload.
        WRITE => match abi::args::<WriteIn>(op) {
            Some(write) => {
                let size = (write.size as usize).min(args.len());
                let write_flags = WriteFlags::from_bits_retain(write.write_flags);
                let flags = OpenFlags(write.flags as i32);
                door.write_as(ino, write.offset, &args[..size], write_flags, flags, reply)
            }
            None => reply.error(Errno::EIO),
        },
        RELEASE => match abi::args::<ReleaseIn>(op) {
            Some(release) => door.release_as(ino, FileHandle(release.fh), reply),
            None => reply.error(Errno::EIO),
        },
        GETXATTR => match (abi::args::<GetxattrIn>(op), name(args)) {
            (Some(get), Some(name)) => door.getxattr_as(ino, name, get.size, reply),
            (None, _) => reply.error(Errno::EIO),
            (_, None) => reply.error(Errno::EINVAL),
        },
        // As the door answers it through fuser (see `Door::flush`).
        FLUSH => reply.error(Errno::ENOSYS),
        CREATE => match (abi::args::<CreateIn>(op), name(args)) {
            (Some(create), Some(name)) => {
                door.create_as(who, ino, name, create.mode, create.flags as i32, reply)
            }
            (None, _) => reply.error(Errno::EIO),
            (_, None) => reply.error(Errno::EINVAL),
        },
        _ => return false,
    }
    true
}

/// A name argument: the bytes before its NUL.
fn name(args: &[u8]) -> Option<&[u8]> {
    let end = args.iter().position(|&b| b == 0)?;
    Some(&args[..end]).filter(|n| !n.is_empty())
}

struct Reply<'a>(&'a mut Answered);

impl Answer for Reply<'_> {
    fn error(self, e: Errno) {
        self.0.error = -e.code();
        self.0.body.clear();
    }
}

impl EntryAnswer for Reply<'_> {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        entry_out(&mut self.0.body, ttl, attr, generation);
    }
}

impl AttrAnswer for Reply<'_> {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        let out = AttrOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            dummy: 0,
            attr: fuse_attr(attr),
        };
        self.0.body.extend_from_slice(out.as_bytes());
    }
}

impl EmptyAnswer for Reply<'_> {
    fn ok(self) {}
}

impl DataAnswer for Reply<'_> {
    fn data(self, data: &[u8]) {
        self.0.body.extend_from_slice(data);
    }
}

impl WriteAnswer for Reply<'_> {
    fn written(self, size: u32) {
        let out = WriteOut { size, padding: 0 };
        self.0.body.extend_from_slice(out.as_bytes());
    }
}

impl XattrAnswer for Reply<'_> {
    fn size(self, size: u32) {
        let out = GetxattrOut { size, padding: 0 };
        self.0.body.extend_from_slice(out.as_bytes());
    }

    fn data(self, data: &[u8]) {
        self.0.body.extend_from_slice(data);
    }
}

impl OpenAnswer for Reply<'_> {
    fn opened_as(self, fh: FileHandle, flags: FopenFlags, backing: Option<&Backing>) {
        open_out(&mut self.0.body, fh, flags, backing);
    }
}

impl CreateAnswer for Reply<'_> {
    fn created_as(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
        backing: Option<&Backing>,
    ) {
        entry_out(&mut self.0.body, ttl, attr, generation);
        open_out(&mut self.0.body, fh, flags, backing);
    }
}

/// An entry's answer, its name and attributes trusted for `ttl`.
fn entry_out(b: &mut Vec<u8>, ttl: &Duration, attr: &FileAttr, generation: Generation) {
    let out = EntryOut {
        nodeid: attr.ino.0,
        generation: generation.0,
        entry_valid: ttl.as_secs(),
        attr_valid: ttl.as_secs(),
        entry_valid_nsec: ttl.subsec_nanos(),
        attr_valid_nsec: ttl.subsec_nanos(),
        attr: fuse_attr(attr),
    };
    b.extend_from_slice(out.as_bytes());
}

/// An open's answer; a backing file makes it a passthrough open.
fn open_out(b: &mut Vec<u8>, fh: FileHandle, flags: FopenFlags, backing: Option<&Backing>) {
    let (flags, backing_id) = match backing {
        Some(backing) => (flags | FopenFlags::FOPEN_PASSTHROUGH, backing.id() as i32),
        None => (flags, 0),
    };
    let out = OpenOut {
        fh: fh.0,
        open_flags: flags.bits(),
        backing_id,
    };
    b.extend_from_slice(out.as_bytes());
}

/// Linux's attributes of a file: no creation time or flags.
fn fuse_attr(a: &FileAttr) -> Attr {
    let [atime, mtime, ctime] = [time(a.atime), time(a.mtime), time(a.ctime)];
    Attr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime: atime.0 as u64,
        mtime: mtime.0 as u64,
        ctime: ctime.0 as u64,
        atimensec: atime.1,
        mtimensec: mtime.1,
        ctimensec: ctime.1,
        mode: file_type_bits(a.kind) | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

fn file_type_bits(kind: FileType) -> libc::mode_t {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// The time `secs` and `nanos` after the epoch, the seconds negative before
/// it with the nanoseconds counting forward (as `struct timespec`).
fn system_time(secs: i64, nanos: u32) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(nanos.min(999_999_999)));
    match u64::try_from(secs) {
        Ok(secs) => UNIX_EPOCH + Duration::from_secs(secs) + nanos,
        Err(_) => UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos,
    }
}

/// Seconds and nanoseconds since the epoch, before it negative with the
/// nanoseconds counting forward (as `struct timespec`).
fn time(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(before) => {
            let d = before.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => (-secs, 0),
                n => (-secs - 1, 1_000_000_000 - n),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use layerfs_vfs::LocalFs;

    use crate::attrs::Caching;

    const ROOT: u64 = 1;

    fn header(opcode: u32, nodeid: u64) -> InHeader {
        InHeader {
            len: 0,
            opcode,
            unique: 9,
            nodeid,
            uid: 0,
            gid: 0,
            pid: std::process::id(),
            total_extlen: 0,
            padding: 0,
        }
    }

    // The kernel's offsets, read on their own: a check of the typed layout.
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
    }

    /// Answers one request; None where the ring would hand it to fuser.
    fn ask(door: &Door, opcode: u32, nodeid: u64, op: &[u8], payload: &[u8]) -> Option<Answered> {
        let mut out = Answered {
            error: 1,
            body: b"stale".to_vec(),
        };
        answer(door, &header(opcode, nodeid), op, payload, &mut out).then_some(out)
    }

    fn door(dir: &std::path::Path, caching: Caching) -> Door {
        let fs = LocalFs::open(dir).unwrap();
        Door::new(Arc::new(fs), caching, false)
    }

    fn words(op: &[u32]) -> Vec<u8> {
        op.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn a_header_is_read_where_the_kernel_puts_each_field() {
        let mut b = [0u8; IN_HEADER_LEN];
        b[0..4].copy_from_slice(&77u32.to_ne_bytes());
        b[4..8].copy_from_slice(&CREATE.to_ne_bytes());
        b[8..16].copy_from_slice(&5u64.to_ne_bytes());
        b[16..24].copy_from_slice(&6u64.to_ne_bytes());
        b[24..28].copy_from_slice(&1000u32.to_ne_bytes());
        b[28..32].copy_from_slice(&100u32.to_ne_bytes());
        b[32..36].copy_from_slice(&42u32.to_ne_bytes());
        b[36..38].copy_from_slice(&3u16.to_ne_bytes());
        let h: InHeader = abi::args(&b).unwrap();
        assert_eq!(
            (
                h.len,
                h.opcode,
                h.unique,
                h.nodeid,
                h.uid,
                h.gid,
                h.pid,
                h.total_extlen
            ),
            (77, CREATE, 5, 6, 1000, 100, 42, 3)
        );
        let out = out_header(5, -2, 8);
        let out = out.as_bytes();
        assert_eq!(&out[0..4], &24u32.to_ne_bytes(), "the header counts itself");
        assert_eq!(&out[4..8], &(-2i32).to_ne_bytes());
        assert_eq!(&out[8..16], &5u64.to_ne_bytes());
        assert!(
            abi::args::<InHeader>(&b[..IN_HEADER_LEN - 1]).is_none(),
            "too short"
        );
    }

    #[test]
    fn times_before_the_epoch_count_their_nanoseconds_forward() {
        let t = |d: Duration| time(UNIX_EPOCH - d);
        assert_eq!(t(Duration::new(1, 500_000_000)), (-2, 500_000_000));
        assert_eq!(t(Duration::from_secs(3)), (-3, 0));
        assert_eq!(time(UNIX_EPOCH + Duration::new(7, 9)), (7, 9));
        for (secs, nanos) in [(-2, 500_000_000), (-3, 0), (7, 9), (0, 1)] {
            assert_eq!(time(system_time(secs, nanos)), (secs, nanos), "read back");
        }
    }

    /// `struct fuse_setattr_in` with `valid`, size, times, mode, uid, gid.
    fn setattr_in_of(valid: u32, size: u64, times: [(i64, u32); 2], ids: [u32; 3]) -> Vec<u8> {
        let mut b = vec![0u8; 88];
        b[0..4].copy_from_slice(&valid.to_ne_bytes());
        b[16..24].copy_from_slice(&size.to_ne_bytes());
        b[32..40].copy_from_slice(&times[0].0.to_ne_bytes());
        b[40..48].copy_from_slice(&times[1].0.to_ne_bytes());
        b[56..60].copy_from_slice(&times[0].1.to_ne_bytes());
        b[60..64].copy_from_slice(&times[1].1.to_ne_bytes());
        for (at, word) in [68, 76, 80].into_iter().zip(ids) {
            b[at..at + 4].copy_from_slice(&word.to_ne_bytes());
        }
        b
    }

    #[test]
    fn a_setattr_sets_what_its_valid_bits_name_and_answers_the_attributes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello world").unwrap();
        let d = door(dir.path(), Caching::Shared);
        let nodeid = u64_at(&ask(&d, LOOKUP, ROOT, &[], b"f\0").unwrap().body, 0);
        let meta = std::fs::metadata(dir.path().join("f")).unwrap();
        // Size, mode and the modification time; the access time and the
        // owner are there but not valid.
        let valid = FATTR_SIZE | FATTR_MODE | FATTR_MTIME;
        let op = setattr_in_of(valid, 5, [(1, 2), (-2, 500_000_000)], [0o100600, 7, 8]);
        let set = ask(&d, SETATTR, nodeid, &op, &[]).unwrap();
        assert_eq!((set.error, set.body.len()), (0, 16 + 88), "fuse_attr_out");
        let now = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"hello");
        assert_eq!(now.mode() & 0o7777, 0o600);
        assert_eq!((now.mtime(), now.mtime_nsec()), (-2, 500_000_000));
        assert_eq!((now.atime(), now.uid()), (meta.atime(), meta.uid()));
        assert_eq!(u64_at(&set.body, 16 + 8), 5, "the answer's size");
        // The access time set to now.
        let op = setattr_in_of(FATTR_ATIME | FATTR_ATIME_NOW, 0, [(1, 2), (0, 0)], [0; 3]);
        assert_eq!(ask(&d, SETATTR, nodeid, &op, &[]).unwrap().error, 0);
        let now = std::fs::metadata(dir.path().join("f")).unwrap();
        assert!(
            now.atime() > 1,
            "not the time in the request: {}",
            now.atime()
        );
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"hello");
        // A request too short for its arguments.
        let short = ask(&d, SETATTR, nodeid, &[0; 40], &[]).unwrap();
        assert_eq!(short.error, -libc::EIO);
    }

    #[test]
    fn a_lookup_and_a_getattr_are_laid_out_as_struct_fuse_entry_out_and_attr_out() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"hello").unwrap();
        let d = door(dir.path(), Caching::Shared);
        let found = ask(&d, LOOKUP, ROOT, &[], b"f\0").unwrap();
        assert_eq!(found.error, 0);
        let b = &found.body;
        assert_eq!(b.len(), 40 + 88, "fuse_entry_out");
        let nodeid = u64_at(b, 0);
        assert_ne!(nodeid, 0);
        assert_eq!(
            u64_at(b, 16),
            1,
            "entry_valid: one second for a shared directory"
        );
        assert_eq!(u64_at(b, 40), nodeid, "fuse_attr.ino");
        assert_eq!(u64_at(b, 48), 5, "fuse_attr.size");
        let meta = std::fs::metadata(dir.path().join("f")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(u64_at(b, 40 + 32) as i64, meta.mtime(), "fuse_attr.mtime");
        assert_eq!(
            u32_at(b, 40 + 52),
            meta.mtime_nsec() as u32,
            "fuse_attr.mtimensec"
        );
        assert_eq!(u32_at(b, 40 + 60), meta.mode(), "fuse_attr.mode");
        assert_eq!(u32_at(b, 40 + 64), 1, "fuse_attr.nlink");
        assert_eq!(u32_at(b, 40 + 80), 4096, "fuse_attr.blksize");

        let attr = ask(&d, GETATTR, nodeid, &[0; 16], &[]).unwrap();
        assert_eq!(attr.error, 0);
        assert_eq!(attr.body.len(), 16 + 88, "fuse_attr_out");
        assert_eq!(&attr.body[16..], &b[40..], "the same attributes");

        let missing = ask(&d, LOOKUP, ROOT, &[], b"nothing\0").unwrap();
        assert_eq!((missing.error, missing.body.len()), (-libc::ENOENT, 0));
        // Where nothing changes behind the door, a negative entry instead.
        let d = door(dir.path(), Caching::Exclusive);
        let negative = ask(&d, LOOKUP, ROOT, &[], b"nothing\0").unwrap();
        assert_eq!((negative.error, u64_at(&negative.body, 0)), (0, 0));
    }

    #[test]
    fn a_file_is_created_written_read_and_removed_through_the_ring_s_answers() {
        let dir = tempfile::tempdir().unwrap();
        let d = door(dir.path(), Caching::Shared);
        let flags = (libc::O_CREAT | libc::O_EXCL | libc::O_RDWR) as u32;
        let made = ask(
            &d,
            CREATE,
            ROOT,
            &words(&[flags, 0o100640, 0o022, 0]),
            b"new\0",
        )
        .unwrap();
        assert_eq!(made.error, 0);
        assert_eq!(made.body.len(), 128 + 16, "fuse_entry_out, fuse_open_out");
        let nodeid = u64_at(&made.body, 0);
        assert_eq!(u32_at(&made.body, 40 + 60), libc::S_IFREG | 0o640);
        let fh = u64_at(&made.body, 128);
        assert_eq!(
            u32_at(&made.body, 140),
            0,
            "no backing file without passthrough"
        );

        let mut write_in = fh.to_ne_bytes().to_vec();
        write_in.extend_from_slice(&0u64.to_ne_bytes()); // offset
        write_in.extend_from_slice(&words(&[5, 0]));
        write_in.extend_from_slice(&[0; 16]);
        let written = ask(&d, WRITE, nodeid, &write_in, b"hello").unwrap();
        assert_eq!((written.error, u32_at(&written.body, 0)), (0, 5));
        assert_eq!(std::fs::read(dir.path().join("new")).unwrap(), b"hello");

        let mut read_in = fh.to_ne_bytes().to_vec();
        read_in.extend_from_slice(&1u64.to_ne_bytes());
        read_in.extend_from_slice(&words(&[100, 0]));
        read_in.extend_from_slice(&[0; 16]);
        let read = ask(&d, READ, nodeid, &read_in, &[]).unwrap();
        assert_eq!((read.error, read.body.as_slice()), (0, &b"ello"[..]));

        let none = ask(
            &d,
            GETXATTR,
            nodeid,
            &words(&[0, 0]),
            b"security.capability\0",
        );
        assert!(
            matches!(none, Some(Answered { error, .. }) if error == -libc::ENODATA || error == -libc::ENOSYS)
        );
        let released = ask(
            &d,
            RELEASE,
            nodeid,
            &[fh.to_ne_bytes().as_slice(), &[0; 16]].concat(),
            &[],
        );
        assert_eq!(released.map(|a| (a.error, a.body.len())), Some((0, 0)));
        let opened = ask(&d, OPEN, nodeid, &words(&[libc::O_RDONLY as u32, 0]), &[]).unwrap();
        assert_eq!((opened.error, opened.body.len()), (0, 16));

        let gone = ask(&d, UNLINK, ROOT, &[], b"new\0").unwrap();
        assert_eq!(gone.error, 0);
        assert!(!dir.path().join("new").exists());
        let again = ask(&d, UNLINK, ROOT, &[], b"new\0").unwrap();
        assert_eq!(again.error, -libc::ENOENT);
    }

    #[test]
    fn other_requests_are_left_to_fuser_and_malformed_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = door(dir.path(), Caching::Shared);
        const MKDIR: u32 = 9;
        assert!(ask(&d, MKDIR, ROOT, &words(&[0o755, 0]), b"d\0").is_none());
        assert!(!dir.path().join("d").exists(), "nothing done");
        let unnamed = ask(&d, LOOKUP, ROOT, &[], b"no end").unwrap();
        assert_eq!(unnamed.error, -libc::EINVAL);
        let empty = ask(&d, UNLINK, ROOT, &[], b"\0").unwrap();
        assert_eq!(empty.error, -libc::EINVAL);
        let short = ask(&d, OPEN, ROOT, &[0; 4], &[]).unwrap();
        assert_eq!((short.error, short.body.len()), (-libc::EIO, 0));
        let flush = ask(&d, FLUSH, ROOT, &[0; 24], &[]).unwrap();
        assert_eq!(flush.error, -libc::ENOSYS);
    }
}
