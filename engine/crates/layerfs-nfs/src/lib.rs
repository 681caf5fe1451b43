//! The NFSv3 (RFC 1813) and MOUNT v3 programs served by layerfs.

mod mount;
mod nfs;

pub use mount::MountProgram;
pub use nfs::NfsProgram;

/// Program numbers and versions of the programs served here.
pub const NFS_PROGRAM: u32 = 100_003;
pub const NFS_VERSION: u32 = 3;
pub const MOUNT_PROGRAM: u32 = 100_005;
pub const MOUNT_VERSION: u32 = 3;
