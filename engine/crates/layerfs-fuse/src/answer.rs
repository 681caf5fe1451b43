//! What the door's handlers answer, each kind of answer a trait: the
//! handlers say what to answer, [`crate::wire`]'s reply writes it in the
//! kernel's bytes (`wire/reply.rs`), whichever route the request came by.

use std::time::Duration;

use crate::types::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};

use crate::backing::Backing;

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
