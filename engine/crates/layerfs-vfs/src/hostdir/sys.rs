//! What differs between hosts: how to make data durable, and special files.

use std::ffi::CStr;
use std::os::fd::BorrowedFd;

use rustix::fs::{FileType, Mode};

#[cfg(target_vendor = "apple")]
use crate::error::Error;
use crate::error::Result;

/// Makes a file's data durable (its metadata only as far as needed to read it back).
pub fn sync_data(fd: BorrowedFd<'_>) -> Result<()> {
    #[cfg(target_vendor = "apple")]
    return sync_all(fd);
    #[cfg(not(target_vendor = "apple"))]
    return Ok(rustix::fs::fdatasync(fd)?);
}

/// Makes a file's data and metadata durable. On macOS `fsync` leaves data
/// in the drive's cache; `F_FULLFSYNC` does not.
pub fn sync_all(fd: BorrowedFd<'_>) -> Result<()> {
    #[cfg(target_vendor = "apple")]
    return Ok(rustix::fs::fcntl_fullfsync(fd)?);
    #[cfg(not(target_vendor = "apple"))]
    return Ok(rustix::fs::fsync(fd)?);
}

/// Makes a FIFO, socket or device file.
pub fn mknod(
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: FileType,
    mode: Mode,
    rdev: (u32, u32),
) -> Result<()> {
    #[cfg(not(target_vendor = "apple"))]
    return Ok(rustix::fs::mknodat(
        dir,
        name,
        kind,
        mode,
        rustix::fs::makedev(rdev.0, rdev.1),
    )?);
    #[cfg(target_vendor = "apple")]
    {
        let _ = (dir, name, kind, mode, rdev);
        Err(Error::NotSupp)
    }
}
