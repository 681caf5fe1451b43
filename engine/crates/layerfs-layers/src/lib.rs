//! Immutable layers, the read-only part of a layerfs workspace.
//!
//! A layer is a plain directory tree under `<store>/layers/<id>/`, whiteouts
//! in the OCI convention included (`.wh.NAME` hides NAME below, `.wh..wh..opq`
//! makes a directory opaque), so an image's layer imports unchanged and a
//! workspace's upper directory can become a layer as it is.
#![forbid(unsafe_code)]

mod digest;
pub mod lazy;
pub mod redb_file;
mod stack;
mod store;
mod workspace;
mod xattrs;

pub use digest::tree_digest;
pub use stack::{Change, ChangeKind, ResetDone, StackFs, ENTRY_CHARGE, IN_USE, STATE_IN_UPPER};
pub use store::{remove_tree, LayerId, Progress, Store, Unpack};
pub use workspace::Workspace;
pub use xattrs::{kept_xattrs, Xattrs};

/// The prefix of a whiteout file's name.
pub const WHITEOUT_PREFIX: &str = ".wh.";
/// The name of the marker that makes its directory opaque.
pub const OPAQUE_MARKER: &str = ".wh..wh..opq";
