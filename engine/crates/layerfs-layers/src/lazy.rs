//! Lazy layers: the whole tree of a layer at once, its files' data later,
//! piece by piece, each piece checked against its digest before a byte of
//! it is written.
//!
//! A lazy layer is a layer like any other under `layers/<id>/` (directories,
//! links, owners, modes, times, attributes; each regular file at its size,
//! all holes), plus its state under `lazy/<id>/`:
//! - `index.json`: each file's pieces, where its [`Source`] finds them and
//!   their digests ([`Index`]);
//! - `filled`: the number of each piece written, each record checked,
//!   appended only once the piece's data is durable (`lazy/log.rs`). A kill or a
//!   crash loses at most pieces not yet noted, which are fetched again; a
//!   torn record is cut before anything is appended, never read shifted;
//! - `on-read`: data comes only when read: the layer is not completed in
//!   the background;
//! - `complete`: every piece is in. The index stays, so that another lazy
//!   layer takes a piece it shares (by digest) from this one's file.
//!
//! A store attaches its lazy layers ([`Attached`], one per store). A stack
//! over a lazy layer not yet complete is opened only through its store,
//! and reads a host file only through a `KeptFile` (layerfs-vfs), which
//! asks [`Attached::before_read`] first: a file still waiting for data is
//! found by its host (device, inode), and the pieces the read needs are
//! brought in first. No piece is ever served
//! unchecked: one that does not match its digest fails the read with EIO
//! and the log names the image, the layer and the piece. While no file of
//! the store waits, a read pays one atomic load.

use std::io;
use std::path::PathBuf;

use rustix::fs::Timespec;
use serde::{Deserialize, Serialize};

mod attached;
mod layer;
mod log;
mod pieces;
mod tree;

pub use attached::Attached;
pub use layer::LazyLayer;
pub use pieces::{NOTE_AFTER, NOTE_BYTES};
pub(crate) use tree::{files_in, utf8_path};

/// `len` bytes at `at` in a file, which the source finds at `start..end` of
/// its blob (compressed: the fetcher decompresses), after the first `skip`
/// bytes that range decompresses to, checked by `digest` (`sha256:<hex>`)
/// of the `len` bytes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Piece {
    pub at: u64,
    pub len: u64,
    pub start: u64,
    pub end: u64,
    /// Non-zero where one compressed stream holds several pieces, one after
    /// another (eStargz's `innerOffset`: small files packed together).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skip: u64,
    pub digest: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A regular file of a lazy layer: its path in the layer and its pieces,
/// which cover it (a file with none is whole).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LazyFile {
    pub path: String,
    pub pieces: Vec<Piece>,
    /// Its permission bits on the host. A daemon run as a user lends
    /// itself write permission for the moment it writes a piece into a
    /// file its mode keeps even its owner from writing; a crash in that
    /// moment is undone from this when the layer is next attached. (None
    /// in an index written before it was kept.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// Where a lazy layer's data is: kept with the layer and given back to
/// whoever makes its [`Fetch`], after a restart too. The layer reads only
/// `name`; what reaching the data takes is the fetcher's own
/// (`layerfs-registry` keeps a blob's place in its registry there).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Source {
    /// What the data is known as in log lines and errors (an image
    /// reference, `registry/repository:tag`).
    #[serde(rename = "reference")]
    pub name: String,
    /// The fetcher's own description of where the data is.
    #[serde(flatten)]
    pub place: serde_json::Map<String, serde_json::Value>,
}

/// What `lazy/<id>/index.json` holds.
#[derive(Serialize, Deserialize)]
pub struct Index {
    pub source: Source,
    pub files: Vec<LazyFile>,
}

/// Brings pieces from where a lazy layer's [`Source`] is.
pub trait Fetch: Send + Sync {
    /// The uncompressed bytes of each piece, in the order asked. They are
    /// not trusted: the layer checks each against its digest.
    fn fetch(&self, pieces: &[&Piece]) -> io::Result<Vec<Vec<u8>>>;
}

/// One entry of a lazy layer's tree, as a table of contents gives it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Relative to the layer; `..` and symlinks on the way are refused.
    pub path: PathBuf,
    pub kind: EntryKind,
    /// Permission bits, setuid, setgid and sticky included.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: Option<Timespec>,
    pub xattrs: crate::Xattrs,
}

#[derive(Clone, Debug)]
pub enum EntryKind {
    Dir,
    /// A regular file of `size` bytes whose content has SHA-256 `content`,
    /// brought in as `pieces` (which cover it) are.
    File {
        size: u64,
        content: [u8; 32],
        pieces: Vec<Piece>,
    },
    /// A regular file whose content is at hand (eStargz's table itself).
    Inline(Vec<u8>),
    Symlink(PathBuf),
    /// Another name of a file earlier in the table.
    HardLink(PathBuf),
    Fifo,
    CharDevice(u64),
    BlockDevice(u64),
}

/// The file names in `lazy/<id>/`.
/// The permission bits of a mode, setuid, setgid and sticky included.
pub(crate) const PERMISSIONS: u32 = 0o7777;
pub(crate) const INDEX: &str = "index.json";
pub(crate) const FILLED: &str = "filled";
pub(crate) const COMPLETE: &str = "complete";
pub(crate) const ON_READ: &str = "on-read";

/// `sha256:<hex>` as bytes.
pub fn parse_digest(digest: &str) -> Option<[u8; 32]> {
    let hex = digest.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The most a piece's stream holds before it ([`Piece::skip`]): a table
/// that says more would have each read decompress that much for nothing.
pub const MAX_SKIP: u64 = 64 << 20;

/// Checks that `pieces` cover a file of `size` bytes exactly, in order, lie
/// inside a blob of `blob` bytes, and begin at most [`MAX_SKIP`] bytes into
/// their streams.
pub fn check_pieces(pieces: &[Piece], size: u64, blob: u64) -> Result<(), String> {
    let mut at = 0;
    for piece in pieces {
        if piece.at != at || piece.len == 0 {
            return Err(format!(
                "its pieces do not cover it in order (one at {})",
                piece.at
            ));
        }
        if piece.start >= piece.end || piece.end > blob {
            return Err(format!(
                "a piece at {}..{} is outside the blob of {blob} bytes",
                piece.start, piece.end
            ));
        }
        if piece.skip > MAX_SKIP {
            return Err(format!(
                "a piece at {} lies {} bytes into its stream, past {MAX_SKIP}",
                piece.at, piece.skip
            ));
        }
        if parse_digest(&piece.digest).is_none() {
            return Err(format!("a piece's digest {:?} is not sha256", piece.digest));
        }
        at += piece.len;
    }
    if at != size && !(pieces.is_empty() && size == 0) {
        return Err(format!("its pieces hold {at} of its {size} bytes"));
    }
    Ok(())
}
