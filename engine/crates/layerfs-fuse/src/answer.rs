//! How the door answers a request: through fuser's replies, or into the
//! buffers of a CPU's ring ([`crate::uring`]). The door's handlers for the
//! requests a ring answers itself are written against these traits.

use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FopenFlags, Generation, ReplyAttr, ReplyCreate, ReplyData,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, ReplyXattr,
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
    ReplyCreate
);

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
