//! How the door answers a request: through fuser's replies, or into the
//! buffers of a CPU's ring ([`crate::uring`]). The door's handlers for the
//! requests a ring answers itself are written against these traits.

use std::time::Duration;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr,
};

use crate::backing::Backing;
use crate::opens::Registered;

/// An answer that may be an error.
pub trait Answer {
    fn error(self, e: Errno);
}

pub trait EntryAnswer: Answer {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation);
}

pub trait AttrAnswer: Answer {
    fn attr(self, ttl: &Duration, attr: &FileAttr);
}

pub trait EmptyAnswer: Answer {
    fn ok(self);
}

pub trait DataAnswer: Answer {
    fn data(self, data: &[u8]);
}

pub trait WriteAnswer: Answer {
    fn written(self, size: u32);
}

pub trait XattrAnswer: Answer {
    /// The size of the value, for a caller that asked for it alone.
    fn size(self, size: u32);
    fn data(self, data: &[u8]);
}

pub trait OpenAnswer: Answer {
    /// Opened as file handle `fh`; passthrough to `backing` where given.
    fn opened_as(self, fh: FileHandle, flags: FopenFlags, backing: Option<&Backing>);
}

pub trait CreateAnswer: Answer {
    fn created_as(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
        backing: Option<&Backing>,
    );
}

/// A listing (READDIR): entries added until the reply is full, then sent.
pub trait ListingAnswer: Answer {
    /// Adds an entry; true when the reply had no room left for it.
    fn add(&mut self, ino: INodeNo, cookie: u64, kind: FileType, name: &[u8]) -> bool;
    fn ok(self);
}

/// A listing with each entry's attributes (READDIRPLUS).
pub trait ListingPlusAnswer: Answer {
    /// Adds an entry; true when the reply had no room left for it.
    fn add(
        &mut self,
        cookie: u64,
        name: &[u8],
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool;
    fn ok(self);
}

/// What STATFS tells: the filesystem's figures in blocks of `block` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Statfs {
    pub blocks: u64,
    pub free: u64,
    pub available: u64,
    pub files: u64,
    pub free_files: u64,
    pub block: u32,
    pub name_max: u32,
}

pub trait StatfsAnswer: Answer {
    fn statfs(self, figures: Statfs);
}

macro_rules! errors {
    ($($reply:ty),*) => {$(
        impl Answer for $reply {
            fn error(self, e: Errno) {
                <$reply>::error(self, e)
            }
        }
    )*};
}

errors!(
    ReplyEntry,
    ReplyAttr,
    ReplyEmpty,
    ReplyData,
    ReplyWrite,
    ReplyXattr,
    ReplyOpen,
    ReplyCreate,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyStatfs,
    ReplyIoctl
);

impl ListingAnswer for ReplyDirectory {
    fn add(&mut self, ino: INodeNo, cookie: u64, kind: FileType, name: &[u8]) -> bool {
        ReplyDirectory::add(self, ino, cookie, kind, OsStr::from_bytes(name))
    }

    fn ok(self) {
        ReplyDirectory::ok(self)
    }
}

impl ListingPlusAnswer for ReplyDirectoryPlus {
    fn add(
        &mut self,
        cookie: u64,
        name: &[u8],
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let name = OsStr::from_bytes(name);
        ReplyDirectoryPlus::add(self, attr.ino, cookie, name, ttl, attr, generation)
    }

    fn ok(self) {
        ReplyDirectoryPlus::ok(self)
    }
}

impl StatfsAnswer for ReplyStatfs {
    fn statfs(self, s: Statfs) {
        let (blocks, block) = (s.blocks, s.block);
        ReplyStatfs::statfs(
            self,
            blocks,
            s.free,
            s.available,
            s.files,
            s.free_files,
            block,
            s.name_max,
            block,
        )
    }
}

impl EntryAnswer for ReplyEntry {
    fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        ReplyEntry::entry(self, ttl, attr, generation)
    }
}

impl AttrAnswer for ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        ReplyAttr::attr(self, ttl, attr)
    }
}

impl EmptyAnswer for ReplyEmpty {
    fn ok(self) {
        ReplyEmpty::ok(self)
    }
}

impl DataAnswer for ReplyData {
    fn data(self, data: &[u8]) {
        ReplyData::data(self, data)
    }
}

impl WriteAnswer for ReplyWrite {
    fn written(self, size: u32) {
        ReplyWrite::written(self, size)
    }
}

impl XattrAnswer for ReplyXattr {
    fn size(self, size: u32) {
        ReplyXattr::size(self, size)
    }

    fn data(self, data: &[u8]) {
        ReplyXattr::data(self, data)
    }
}

impl OpenAnswer for ReplyOpen {
    #[allow(unsafe_code)]
    fn opened_as(self, fh: FileHandle, flags: FopenFlags, backing: Option<&Backing>) {
        match backing {
            None => self.opened(fh, flags),
            Some(b) => {
                // SAFETY: the number is open in this session while `b`
                // lives, and `b` outlives the answer. fuser's wrapper is
                // only lent for the answer: `into_raw` keeps it from
                // closing what `b` closes.
                let id = unsafe { self.wrap_backing(b.id()) };
                self.opened_passthrough(fh, flags, &id);
                let _ = id.into_raw();
            }
        }
    }
}

impl CreateAnswer for ReplyCreate {
    #[allow(unsafe_code)]
    fn created_as(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
        backing: Option<&Backing>,
    ) {
        match backing {
            None => self.created(ttl, attr, generation, fh, flags),
            Some(b) => {
                // SAFETY: as for an open, above.
                let id = unsafe { self.wrap_backing(b.id()) };
                self.created_passthrough(ttl, attr, generation, fh, flags, &id);
                let _ = id.into_raw();
            }
        }
    }
}
