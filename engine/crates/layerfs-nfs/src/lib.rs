//! The NFSv3 (RFC 1813) and MOUNT v3 programs served by layerfs, over the
//! [`layerfs_vfs::Filesystem`] trait.
#![forbid(unsafe_code)]

mod access;
mod convert;
mod drc;
mod error;
mod export;
mod handle;
mod mount;
pub mod mount_options;
mod nfs;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use layerfs_rpc::{Dispatcher, Program, Server, ServerConfig, ServerHandle};
use layerfs_vfs::Filesystem;

pub use error::Error;

pub use export::{Export, Exports};
pub use handle::{FileHandle, HandleKey, SignedHandles};
pub use mount::MountProgram;
pub use nfs::NfsProgram;

/// Program numbers and versions of the programs served here.
pub const NFS_PROGRAM: u32 = 100_003;
pub const NFS_VERSION: u32 = 3;
pub const MOUNT_PROGRAM: u32 = 100_005;
pub const MOUNT_VERSION: u32 = 3;

/// The NFS and MOUNT programs for one exported filesystem, ready for a
/// [`layerfs_rpc::Dispatcher`]. `host_path` is the path clients may mount
/// besides `/`.
pub fn programs(
    fs: Arc<dyn Filesystem>,
    host_path: &[u8],
) -> layerfs_vfs::Result<Vec<Box<dyn Program>>> {
    Ok(programs_for(Export::new(fs, host_path)?))
}

/// The NFS and MOUNT programs for `export`.
pub fn programs_for(export: Export) -> Vec<Box<dyn Program>> {
    programs_of(Arc::new(Exports::one(export)))
}

/// The NFS and MOUNT programs for a table of exports, which may change
/// while they serve.
pub fn programs_of(exports: Arc<Exports>) -> Vec<Box<dyn Program>> {
    vec![
        Box::new(NfsProgram::new(exports.clone())),
        Box::new(MountProgram::new(exports)),
    ]
}

/// Serves `fs` over NFSv3 and MOUNT v3 on `addr` (port 0: one the system
/// picks; [`ServerHandle::local_addr`] tells which) until the handle is
/// stopped or dropped, which closes every connection and ends every thread.
/// `host_path` as in [`programs`].
pub fn serve(
    fs: Arc<dyn Filesystem>,
    host_path: &[u8],
    addr: SocketAddr,
    config: ServerConfig,
) -> io::Result<ServerHandle> {
    let export =
        Export::new(fs, host_path).map_err(|e| io::Error::other(format!("cannot export: {e}")))?;
    serve_export(export, addr, config)
}

/// [`serve`] for an export already made (with its squash, say).
pub fn serve_export(
    export: Export,
    addr: SocketAddr,
    config: ServerConfig,
) -> io::Result<ServerHandle> {
    serve_exports(Arc::new(Exports::one(export)), addr, config)
}

/// Serves every export of `exports`, as they come and go, on `addr`.
pub fn serve_exports(
    exports: Arc<Exports>,
    addr: SocketAddr,
    config: ServerConfig,
) -> io::Result<ServerHandle> {
    let programs = programs_of(exports);
    Server::bind(addr, Arc::new(Dispatcher::new(programs)), config)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?
        .spawn()
}
