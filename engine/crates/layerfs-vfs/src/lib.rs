//! The filesystem layerfs serves, as both its doors (NFS, FUSE) see it.
//!
//! [`Filesystem`] is synchronous and keyed by stable file ids (inode numbers);
//! it takes the caller's credentials and returns the attributes before and
//! after every change, which NFS needs for its clients' caches. [`LocalFs`]
//! serves one host directory.
// Each use of `unsafe` is allowed where it is, with its reason.
#![deny(unsafe_code)]

pub mod access;
mod attr;
pub mod bounded;
mod error;
mod fs;
pub mod hostdir;
pub mod ids;
mod local;
pub mod stripes;

pub use access::{Caller, Groups};
pub use attr::{Attr, AttrBefore, Change, FileKind, SetAttr, SetTime, Timestamp};
pub use error::{Error, Result};
pub use fs::{
    Allocate, Create, DirEntry, DirPage, Filesystem, Fill, FsStat, Hints, Holder, HostFiles,
    KeptFile, Name, NewEntry, NoHints, ReadSource, RemovedFile, Stability, XattrFlags,
    READS_AT_HAND,
};
pub use local::LocalFs;

/// Unique, stable number of a file within one filesystem.
pub type FileId = u64;

/// Longest name of a directory entry, in bytes.
pub const NAME_MAX: usize = 255;
