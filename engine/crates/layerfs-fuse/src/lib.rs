//! The FUSE door: a [`layerfs_vfs::Filesystem`] served through the Linux
//! kernel's FUSE, for users without an NFS client in their kernel or without
//! root.
//!
//! The door translates; every rule (permissions, layers, ids) is the
//! filesystem's, exactly as the NFS door gets it. What is the door's own is how
//! much the kernel may cache, set by [`Caching`], and which of FUSE's speed-ups
//! it asks for (docs/architecture/engine/kernel-routes/fuse.md says why each).
//!
//! Linux only: elsewhere the crate is empty.
// Each use of `unsafe` is allowed where it is, with its reason.
#![deny(unsafe_code)]

#[cfg(target_os = "linux")]
mod abi;
#[cfg(target_os = "linux")]
mod answer;
#[cfg(target_os = "linux")]
mod attrs;
#[cfg(target_os = "linux")]
mod backing;
#[cfg(target_os = "linux")]
mod callers;
#[cfg(target_os = "linux")]
mod connection;
#[cfg(target_os = "linux")]
mod devfuse;
#[cfg(target_os = "linux")]
mod door;
#[cfg(target_os = "linux")]
mod forgets;
#[cfg(all(target_os = "linux", feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(target_os = "linux")]
pub mod handover;
#[cfg(target_os = "linux")]
mod limits;
#[cfg(target_os = "linux")]
mod mount;
#[cfg(target_os = "linux")]
mod mounting;
#[cfg(target_os = "linux")]
mod open_table;
#[cfg(target_os = "linux")]
mod opens;
#[cfg(target_os = "linux")]
mod privilege;
#[cfg(target_os = "linux")]
mod request;
#[cfg(target_os = "linux")]
mod resident;
#[cfg(target_os = "linux")]
mod routes;
#[cfg(target_os = "linux")]
mod types;
#[cfg(target_os = "linux")]
mod uring;
#[cfg(target_os = "linux")]
mod wire;

#[cfg(target_os = "linux")]
pub use handover::{Kept, KernelInit};
#[cfg(target_os = "linux")]
pub use mount::{mount, resume, Caching, Mounted, Options};
