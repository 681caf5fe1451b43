//! What differs between hosts: how to make data durable, special files, and
//! system calls newer than the host's kernel may have.

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

/// `fchmodat2(dir, name, mode, AT_SYMLINK_NOFOLLOW)` (Linux 6.6): a chmod
/// that refuses a symlink (`EOPNOTSUPP`) in one system call. `None` where
/// the kernel, or a seccomp filter, does not let it run; after `ENOSYS` it
/// is not tried again.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn fchmodat2_nofollow(
    dir: BorrowedFd<'_>,
    name: &CStr,
    mode: Mode,
) -> Option<std::result::Result<(), rustix::io::Errno>> {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    // Every architecture numbers the system calls added since Linux 5.1 alike.
    const SYS_FCHMODAT2: libc::c_long = 452;
    static MISSING: AtomicBool = AtomicBool::new(false);
    if MISSING.load(Relaxed) {
        return None;
    }
    // SAFETY: the descriptor and the NUL-terminated name outlive the call,
    // which reads nothing else of this process.
    let done = unsafe {
        libc::syscall(
            SYS_FCHMODAT2,
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::c_uint::from(mode.bits()),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if done == 0 {
        return Some(Ok(()));
    }
    match rustix::io::Errno::from_io_error(&std::io::Error::last_os_error()) {
        Some(rustix::io::Errno::NOSYS) => {
            MISSING.store(true, Relaxed);
            None
        }
        // What an older seccomp filter answers for a call it does not know.
        Some(rustix::io::Errno::PERM) => None,
        Some(errno) => Some(Err(errno)),
        None => None,
    }
}

/// Renames `from` in `from_dir` to `to` in `to_dir` only where `to` names
/// nothing (`RENAME_NOREPLACE`, macOS' `RENAME_EXCL`): `false`, with
/// nothing changed, where it names something, where the host's filesystem
/// does not know the flag, or where the rename is refused as invalid (a
/// directory into itself), so a plain rename then gives the answer.
pub fn rename_anew(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> Result<bool> {
    use rustix::fs::RenameFlags;
    use rustix::io::Errno;
    match rustix::fs::renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(true),
        Err(Errno::EXIST | Errno::INVAL | Errno::NOTSUP) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
