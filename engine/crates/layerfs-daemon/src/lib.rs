//! The workspace daemon: a store of layers and workspaces, each workspace
//! mounted through the kernel's NFS client (one NFS server for all of them)
//! or through FUSE, driven by the `layerfs` command over a control socket.
//!
//! ```text
//! <store>/layers/<id>/         layers (layerfs_layers::Store)
//! <store>/workspaces/<name>/   workspaces (layerfs_layers::Workspace)
//! <store>/catalog.redb         what the store holds beyond files: workspaces,
//!                              their mounts, layer notes, the NFS port
//! <store>/daemon.lock          held by the one daemon serving the store
//! ```
// Each use of `unsafe` is allowed where it is, with its reason.
#![deny(unsafe_code)]

pub mod catalog;
pub mod control;
mod daemon;
#[cfg(target_os = "linux")]
pub mod keeper;
pub mod mounting;
pub mod paths;
pub mod protocol;
mod service;

pub use daemon::{run, DaemonConfig};
