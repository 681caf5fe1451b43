//! Answers written as the kernel reads them: `struct fuse_entry_out`,
//! `fuse_attr_out`, `fuse_open_out`, listings of `fuse_dirent(plus)`, ...
//! into an [`Answered`]'s body.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::types::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};
use zerocopy::IntoBytes;

use super::Answered;
use crate::abi::{
    Attr, AttrOut, Dirent, DirentPlus, EntryOut, GetxattrOut, OpenOut, StatfsOut, WriteOut,
};
use crate::answer::{
    Answer, AttrAnswer, CreateAnswer, DataAnswer, EmptyAnswer, EntryAnswer, ListingAnswer,
    ListingPlusAnswer, OpenAnswer, Statfs, StatfsAnswer, WriteAnswer, XattrAnswer,
};
use crate::backing::Backing;
use crate::opens::Registered;

pub(super) struct Reply<'a>(pub(super) &'a mut Answered);

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

impl StatfsAnswer for Reply<'_> {
    fn statfs(self, s: Statfs) {
        let out = StatfsOut {
            blocks: s.blocks,
            bfree: s.free,
            bavail: s.available,
            files: s.files,
            ffree: s.free_files,
            bsize: s.block,
            namelen: s.name_max,
            frsize: s.block,
            ..Default::default()
        };
        self.0.body.extend_from_slice(out.as_bytes());
    }
}

/// A READDIR or READDIRPLUS answer: entries, each padded to 8 bytes, while
/// they fit in the `max` bytes the kernel asked for.
pub(super) struct Listing<'a> {
    out: &'a mut Answered,
    max: usize,
}

impl<'a> Listing<'a> {
    pub(super) fn new(out: &'a mut Answered, max: u32) -> Listing<'a> {
        Listing {
            out,
            max: max as usize,
        }
    }

    /// Adds an entry of `head` then `name`; true, with nothing added, when
    /// it does not fit.
    fn push(&mut self, head: &[u8], name: &[u8]) -> bool {
        let len = (head.len() + name.len()).next_multiple_of(8);
        let body = &mut self.out.body;
        if body.len() + len > self.max {
            return true;
        }
        let end = body.len() + len;
        body.extend_from_slice(head);
        body.extend_from_slice(name);
        body.resize(end, 0);
        false
    }
}

impl Answer for Listing<'_> {
    fn error(self, e: Errno) {
        Reply(self.out).error(e)
    }
}

impl ListingAnswer for Listing<'_> {
    fn add(&mut self, ino: INodeNo, cookie: u64, kind: FileType, name: &[u8]) -> bool {
        let head = Dirent {
            ino: ino.0,
            off: cookie,
            namelen: name.len() as u32,
            typ: file_type_bits(kind) >> 12,
        };
        self.push(head.as_bytes(), name)
    }

    fn ok(self) {}
}

impl ListingPlusAnswer for Listing<'_> {
    fn add(
        &mut self,
        cookie: u64,
        name: &[u8],
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let entry_out = entry_of(ttl, attr, generation);
        let head = DirentPlus {
            dirent: Dirent {
                ino: entry_out.attr.ino,
                off: cookie,
                namelen: name.len() as u32,
                typ: entry_out.attr.mode >> 12,
            },
            entry_out,
        };
        self.push(head.as_bytes(), name)
    }

    fn ok(self) {}
}

/// An entry's answer, its name and attributes trusted for `ttl`.
fn entry_out(b: &mut Vec<u8>, ttl: &Duration, attr: &FileAttr, generation: Generation) {
    b.extend_from_slice(entry_of(ttl, attr, generation).as_bytes());
}

fn entry_of(ttl: &Duration, attr: &FileAttr, generation: Generation) -> EntryOut {
    EntryOut {
        nodeid: attr.ino.0,
        generation: generation.0,
        entry_valid: ttl.as_secs(),
        attr_valid: ttl.as_secs(),
        entry_valid_nsec: ttl.subsec_nanos(),
        attr_valid_nsec: ttl.subsec_nanos(),
        attr: fuse_attr(attr),
    }
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
pub(super) fn fuse_attr(a: &FileAttr) -> Attr {
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
pub(super) fn system_time(secs: i64, nanos: u32) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(nanos.min(999_999_999)));
    match u64::try_from(secs) {
        Ok(secs) => UNIX_EPOCH + Duration::from_secs(secs) + nanos,
        Err(_) => UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos,
    }
}

/// Seconds and nanoseconds since the epoch, before it negative with the
/// nanoseconds counting forward (as `struct timespec`).
pub(super) fn time(t: SystemTime) -> (i64, u32) {
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
