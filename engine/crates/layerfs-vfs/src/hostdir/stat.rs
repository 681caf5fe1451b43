//! Host attributes in one syscall each.

use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, FileType};

use crate::attr::{Attr, FileKind, Timestamp};
use crate::error::Result;

fn kind(mode: u32) -> FileKind {
    match FileType::from_raw_mode(mode) {
        FileType::Directory => FileKind::Directory,
        FileType::Symlink => FileKind::Symlink,
        FileType::BlockDevice => FileKind::BlockDevice,
        FileType::CharacterDevice => FileKind::CharDevice,
        FileType::Fifo => FileKind::Fifo,
        FileType::Socket => FileKind::Socket,
        _ => FileKind::Regular,
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;
    use rustix::fs::{statx, StatxFlags, StatxTimestamp};

    fn ts(t: StatxTimestamp) -> Timestamp {
        Timestamp {
            secs: t.tv_sec,
            nanos: t.tv_nsec,
        }
    }

    pub fn fd(fd: BorrowedFd<'_>) -> Result<Attr> {
        stat(fd, c"", AtFlags::EMPTY_PATH)
    }

    pub fn stat<P: rustix::path::Arg>(
        dir: BorrowedFd<'_>,
        name: P,
        flags: AtFlags,
    ) -> Result<Attr> {
        let s = statx(
            dir,
            name,
            flags | AtFlags::SYMLINK_NOFOLLOW,
            StatxFlags::BASIC_STATS | StatxFlags::BTIME,
        )?;
        let generation = if s.stx_mask & StatxFlags::BTIME.bits() != 0 {
            (s.stx_btime.tv_sec as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(u64::from(s.stx_btime.tv_nsec))
        } else {
            0
        };
        let mode = u32::from(s.stx_mode);
        Ok(Attr {
            kind: kind(mode),
            mode: mode & 0o7777,
            nlink: s.stx_nlink,
            uid: s.stx_uid,
            gid: s.stx_gid,
            size: s.stx_size,
            used: s.stx_blocks * 512,
            rdev: (s.stx_rdev_major, s.stx_rdev_minor),
            fileid: s.stx_ino,
            generation,
            atime: ts(s.stx_atime),
            mtime: ts(s.stx_mtime),
            ctime: ts(s.stx_ctime),
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::*;

    pub fn fd(fd: BorrowedFd<'_>) -> Result<Attr> {
        Ok(from_stat(&rustix::fs::fstat(fd)?))
    }

    pub fn stat<P: rustix::path::Arg>(
        dir: BorrowedFd<'_>,
        name: P,
        flags: AtFlags,
    ) -> Result<Attr> {
        Ok(from_stat(&rustix::fs::statat(
            dir,
            name,
            flags | AtFlags::SYMLINK_NOFOLLOW,
        )?))
    }

    /// No birth time here: generations are 0 and a reused id is told apart
    /// only while the server runs.
    fn from_stat(s: &rustix::fs::Stat) -> Attr {
        let mode = s.st_mode as u32;
        let rdev = s.st_rdev as u64;
        Attr {
            kind: kind(mode),
            mode: mode & 0o7777,
            nlink: s.st_nlink as u32,
            uid: s.st_uid,
            gid: s.st_gid,
            size: s.st_size as u64,
            used: s.st_blocks as u64 * 512,
            rdev: (rustix::fs::major(rdev), rustix::fs::minor(rdev)),
            fileid: s.st_ino as u64,
            generation: 0,
            atime: Timestamp {
                secs: s.st_atime as i64,
                nanos: s.st_atime_nsec as u32,
            },
            mtime: Timestamp {
                secs: s.st_mtime as i64,
                nanos: s.st_mtime_nsec as u32,
            },
            ctime: Timestamp {
                secs: s.st_ctime as i64,
                nanos: s.st_ctime_nsec as u32,
            },
        }
    }
}

/// Reads attributes for one export.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    /// Whether a file's birth time identifies it. Not on overlayfs, where a
    /// file copied up from a lower layer is born again: using it there would
    /// turn every handle stale at the first change.
    birth_is_identity: bool,
}

impl Stats {
    pub fn for_export(root: BorrowedFd<'_>) -> Stats {
        Stats {
            birth_is_identity: !is_overlay(root),
        }
    }

    /// Attributes of `name` in `dir`, not following a final symlink.
    pub fn at<P: rustix::path::Arg>(&self, dir: BorrowedFd<'_>, name: P) -> Result<Attr> {
        self.finish(imp::stat(dir, name, AtFlags::empty()))
    }

    /// Attributes of an open file.
    pub fn fd(&self, fd: BorrowedFd<'_>) -> Result<Attr> {
        self.finish(imp::fd(fd))
    }

    fn finish(&self, attr: Result<Attr>) -> Result<Attr> {
        attr.map(|mut a| {
            if !self.birth_is_identity {
                a.generation = 0;
            }
            a
        })
    }
}

#[cfg(target_os = "linux")]
fn is_overlay(fd: BorrowedFd<'_>) -> bool {
    const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;
    // f_type is i64 here and narrower on other targets.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::fstatfs(fd).is_ok_and(|s| s.f_type as i64 == OVERLAYFS_SUPER_MAGIC)
}

#[cfg(not(target_os = "linux"))]
fn is_overlay(_fd: BorrowedFd<'_>) -> bool {
    false
}
