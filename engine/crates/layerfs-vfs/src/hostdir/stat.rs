//! Host attributes in one syscall each.

use std::os::fd::BorrowedFd;

use parking_lot::Mutex;
use rustix::fs::{AtFlags, FileType};

use crate::attr::{Attr, FileKind, Timestamp};
use crate::error::{Error, Result};

fn kind(mode: u32) -> FileKind {
    match FileType::from_raw_mode(mode as rustix::fs::RawMode) {
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

    pub fn fd(fd: BorrowedFd<'_>) -> Result<(Attr, u64)> {
        stat(fd, c"", AtFlags::EMPTY_PATH)
    }

    /// Attributes and the device holding the file.
    pub fn stat<P: rustix::path::Arg>(
        dir: BorrowedFd<'_>,
        name: P,
        flags: AtFlags,
    ) -> Result<(Attr, u64)> {
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
        let dev = u64::from(s.stx_dev_major) << 32 | u64::from(s.stx_dev_minor);
        let attr = Attr {
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
        };
        Ok((attr, dev))
    }

    /// The id of the mount holding `fd`, as /proc/self/mountinfo numbers it.
    pub fn mount_id(fd: BorrowedFd<'_>) -> Option<u64> {
        let s = statx(fd, c"", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID).ok()?;
        (s.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(s.stx_mnt_id)
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use super::*;

    pub fn fd(fd: BorrowedFd<'_>) -> Result<(Attr, u64)> {
        let s = rustix::fs::fstat(fd)?;
        Ok((from_stat(&s), s.st_dev as u64))
    }

    pub fn stat<P: rustix::path::Arg>(
        dir: BorrowedFd<'_>,
        name: P,
        flags: AtFlags,
    ) -> Result<(Attr, u64)> {
        let s = rustix::fs::statat(dir, name, flags | AtFlags::SYMLINK_NOFOLLOW)?;
        Ok((from_stat(&s), s.st_dev as u64))
    }

    /// No birth time here: generations are 0 and a reused id is told apart
    /// only while the server runs.
    #[allow(clippy::unnecessary_cast)] // stat's field types differ between platforms
    fn from_stat(s: &rustix::fs::Stat) -> Attr {
        let mode = s.st_mode as u32;
        let rdev = s.st_rdev as rustix::fs::Dev;
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

#[cfg(feature = "count-host-calls")]
thread_local! {
    static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Attributes of an open file as the host has them, its inode number for
/// its id, without an export's rules (see [`Stats`]).
pub fn host_attr(fd: BorrowedFd<'_>) -> Result<Attr> {
    imp::fd(fd).map(|(attr, _)| attr)
}

/// [`host_attr`], and the device holding the file.
pub(super) fn with_device(fd: BorrowedFd<'_>) -> Result<(Attr, u64)> {
    imp::fd(fd)
}

/// How many host attribute reads (through [`Stats`]) `op` made on this
/// thread: what tests assert an operation costs.
#[cfg(feature = "count-host-calls")]
pub fn reads_during(op: impl FnOnce()) -> u64 {
    let before = READS.with(|n| n.get());
    op();
    READS.with(|n| n.get()) - before
}

/// Reads attributes for one export.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    /// Whether a file's birth time identifies it. Not on overlayfs, where a
    /// file copied up from a lower layer is born again: using it there would
    /// turn every handle stale at the first change.
    birth_is_identity: bool,
    /// Whether the host keeps a file's inode number for as long as the file
    /// exists, unique across the export. See [`keeps_inode_numbers`].
    keeps_inodes: bool,
    /// Where ids are inode numbers: the export's device. A file on another
    /// (a filesystem mounted inside the export, a btrfs subvolume) numbers
    /// its inodes apart, so its number could be another file's id here.
    dev: Option<u64>,
}

/// Bits of a non-directory's id that hold its host inode number where the
/// host does not keep inode numbers; the bits above hold its device's hash.
const INO_BITS: u32 = 48;

impl Stats {
    pub fn for_export(root: BorrowedFd<'_>) -> Stats {
        let keeps_inodes = keeps_inode_numbers(root);
        Stats {
            birth_is_identity: !is_overlay(root),
            keeps_inodes,
            dev: keeps_inodes
                .then(|| imp::fd(root).ok().map(|(_, dev)| dev))
                .flatten(),
        }
    }

    /// Whether ids taken from inode numbers are stable and unique here.
    /// Where they are not, a non-directory's id also holds its device (so ids
    /// from two filesystems under one overlay do not collide), and a
    /// directory's id is the caller's to give ([`crate::LocalFs`] gives it by
    /// place).
    pub fn keeps_inode_numbers(&self) -> bool {
        self.keeps_inodes
    }

    /// Attributes of `name` in `dir`, not following a final symlink.
    pub fn at<P: rustix::path::Arg>(&self, dir: BorrowedFd<'_>, name: P) -> Result<Attr> {
        self.finish(imp::stat(dir, name, AtFlags::empty()))
    }

    /// Attributes of an open file.
    pub fn fd(&self, fd: BorrowedFd<'_>) -> Result<Attr> {
        self.finish(imp::fd(fd))
    }

    fn finish(&self, stat: Result<(Attr, u64)>) -> Result<Attr> {
        #[cfg(feature = "count-host-calls")]
        READS.with(|n| n.set(n.get() + 1));
        let (mut a, dev) = stat?;
        if self.dev.is_some_and(|export| export != dev) {
            another_filesystem(dev);
            return Err(Error::XDev);
        }
        if a.kind == FileKind::Directory {
            super::lending::show_kept_mode(dev, &mut a);
        }
        if !self.birth_is_identity {
            a.generation = 0;
        }
        if !self.keeps_inodes && a.kind != FileKind::Directory {
            a.fileid = device_and_inode(dev, a.fileid);
        }
        Ok(a)
    }
}

/// Says once per device that its files are not served: an export is one
/// filesystem, as knfsd's is without `crossmnt` and nfs-ganesha's always.
fn another_filesystem(dev: u64) {
    static TOLD: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let mut told = TOLD.lock();
    if !told.contains(&dev) {
        told.push(dev);
        tracing::warn!(
            "files on device {}:{} are on another filesystem than the export \
             (a mount or a btrfs subvolume inside it): they are refused with EXDEV; \
             export that filesystem on its own",
            dev >> 32,
            dev & 0xffff_ffff
        );
    }
}

/// A non-directory's id where inode numbers are unique only per device: the
/// device's hash in bits 48..63 (the top bit clear), the inode below.
fn device_and_inode(dev: u64, ino: u64) -> u64 {
    let mix = |x: u64| (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let dev_bits = mix(dev.wrapping_add(1)) >> (64 - (63 - INO_BITS));
    let low = (ino ^ (ino >> INO_BITS).wrapping_mul(0x9e37_79b9)) & ((1 << INO_BITS) - 1);
    dev_bits << INO_BITS | low
}

/// Whether the filesystem holding `fd` keeps each file's inode number while
/// the file exists, unique within it. Most local filesystems do. Overlayfs
/// does only when all its layers share one filesystem: otherwise a
/// directory's inode number changes once its cache entry is evicted, and
/// other files' numbers are unique only together with their device. Network,
/// 9p and FUSE filesystems vary. Those known to keep them are listed; any
/// other is treated as not keeping them.
#[cfg(target_os = "linux")]
pub fn keeps_inode_numbers(fd: BorrowedFd<'_>) -> bool {
    const KEEP: &[i64] = &[
        0xEF53,      // ext2, ext3, ext4
        0x5846_5342, // xfs
        0x9123_683E, // btrfs
        0x0102_1994, // tmpfs
        0x8584_58F6, // ramfs
        0xF2F5_2010, // f2fs
        0x2FC1_2FC1, // zfs
        0xCA45_1A4E, // bcachefs
    ];
    match fs_type(fd) {
        Some(OVERLAYFS_SUPER_MAGIC) => overlay_on_one_filesystem(fd),
        Some(kind) => KEEP.contains(&kind),
        None => false,
    }
}

#[cfg(target_os = "linux")]
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;

/// The filesystem type (statfs' magic number) holding `fd`.
#[cfg(target_os = "linux")]
fn fs_type(fd: BorrowedFd<'_>) -> Option<i64> {
    // f_type is i64 here and narrower on other targets.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::fstatfs(fd).ok().map(|s| s.f_type as i64)
}

/// Whether every layer of the overlay holding `fd` lives on one filesystem
/// (read from its mount options in /proc/self/mountinfo).
#[cfg(target_os = "linux")]
fn overlay_on_one_filesystem(fd: BorrowedFd<'_>) -> bool {
    let Some(mount) = imp::mount_id(fd) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let Some(line) = info
        .lines()
        .find(|l| l.split(' ').next() == Some(mount.to_string().as_str()))
    else {
        return false;
    };
    let options = line.rsplit(' ').next().unwrap_or("");
    let mut devs = Vec::new();
    for option in options.split(',') {
        let Some((key, value)) = option.split_once('=') else {
            continue;
        };
        if !matches!(key, "lowerdir" | "lowerdir+" | "upperdir" | "datadir+") {
            continue;
        }
        for dir in value.split(':').filter(|d| !d.is_empty()) {
            let dir = dir.replace("\\040", " ");
            match rustix::fs::stat(dir.as_str()) {
                Ok(s) => devs.push(s.st_dev),
                Err(_) => return false,
            }
        }
    }
    !devs.is_empty() && devs.iter().all(|&d| d == devs[0])
}

/// Elsewhere (macOS: APFS and HFS+ keep inode numbers) every export is
/// taken to keep them; a network or FUSE export there is not told apart.
#[cfg(not(target_os = "linux"))]
pub fn keeps_inode_numbers(_fd: BorrowedFd<'_>) -> bool {
    true
}

#[cfg(target_os = "linux")]
fn is_overlay(fd: BorrowedFd<'_>) -> bool {
    fs_type(fd) == Some(OVERLAYFS_SUPER_MAGIC)
}

#[cfg(not(target_os = "linux"))]
fn is_overlay(_fd: BorrowedFd<'_>) -> bool {
    false
}
