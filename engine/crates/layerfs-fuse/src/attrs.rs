//! Between the filesystem's ids and attributes and FUSE's, and how long the
//! kernel may keep them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::types::{FileAttr, FileType, INodeNo};
use layerfs_vfs::{Attr, FileId, FileKind, Timestamp};

/// Who else may change the files under the mount, which bounds how long the
/// kernel may trust what it cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caching {
    /// Every change passes through this door: a stack's layers never change
    /// and its private upper is served by one door at a time. The kernel
    /// keeps names, attributes and file pages until this door changes them.
    Exclusive,
    /// The files are a host directory that other programs may change: names
    /// and attributes are trusted for a second (FUSE's usual default) and
    /// file pages while the file's mtime and size stand.
    Shared,
}

impl Caching {
    /// How long the kernel may keep a name or attributes.
    pub fn ttl(self) -> Duration {
        match self {
            // Not forever: a day bounds what a bug in invalidation could cost.
            Caching::Exclusive => Duration::from_secs(24 * 3600),
            Caching::Shared => Duration::from_secs(1),
        }
    }
}

/// FUSE names the root 1; the filesystem may use any id for it. The two
/// swap, so every id keeps a distinct inode number.
#[derive(Clone, Copy, Debug)]
pub struct Inos {
    root: FileId,
}

impl Inos {
    pub fn new(root: FileId) -> Inos {
        Inos { root }
    }

    pub fn ino(&self, id: FileId) -> INodeNo {
        INodeNo(if id == self.root {
            INodeNo::ROOT.0
        } else if id == INodeNo::ROOT.0 {
            self.root
        } else {
            id
        })
    }

    pub fn id(&self, ino: INodeNo) -> FileId {
        // The swap is its own inverse.
        self.ino(ino.0).0
    }

    pub fn attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: self.ino(a.fileid),
            size: a.size,
            blocks: a.used.div_ceil(512),
            atime: time(a.atime),
            mtime: time(a.mtime),
            ctime: time(a.ctime),
            crtime: UNIX_EPOCH,
            kind: kind(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: libc::makedev(a.rdev.0, a.rdev.1) as u32,
            blksize: 4096,
            flags: 0,
        }
    }
}

pub fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

/// The kind of file a `mknod` mode asks for.
pub fn kind_of_mode(mode: u32) -> Option<FileKind> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Some(FileKind::Regular),
        libc::S_IFDIR => Some(FileKind::Directory),
        libc::S_IFLNK => Some(FileKind::Symlink),
        libc::S_IFBLK => Some(FileKind::BlockDevice),
        libc::S_IFCHR => Some(FileKind::CharDevice),
        libc::S_IFIFO => Some(FileKind::Fifo),
        libc::S_IFSOCK => Some(FileKind::Socket),
        _ => None,
    }
}

pub fn time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(t.nanos.into())
    }
}

pub fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        },
        Err(before) => {
            let d = before.duration();
            let (secs, nanos) = match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n),
            };
            Timestamp { secs, nanos }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_one_swap_and_every_other_id_stays() {
        let inos = Inos::new(1 << 63);
        assert_eq!(inos.ino(1 << 63), INodeNo::ROOT);
        assert_eq!(inos.ino(1), INodeNo(1 << 63));
        assert_eq!(inos.ino(77), INodeNo(77));
        for id in [1, 2, 77, 1 << 63, u64::MAX] {
            assert_eq!(inos.id(inos.ino(id)), id);
        }
        let identity = Inos::new(1);
        assert_eq!(identity.ino(1), INodeNo::ROOT);
        assert_eq!(identity.id(INodeNo(5)), 5);
    }

    #[test]
    fn times_round_trip_on_both_sides_of_the_epoch() {
        for (secs, nanos) in [
            (0, 0),
            (1_700_000_000, 123_456_789),
            (-1, 500),
            (-86_400, 0),
        ] {
            let t = Timestamp { secs, nanos };
            assert_eq!(timestamp(time(t)), t);
        }
    }

    #[test]
    fn mknod_modes_name_their_kind() {
        assert_eq!(kind_of_mode(libc::S_IFIFO | 0o644), Some(FileKind::Fifo));
        assert_eq!(
            kind_of_mode(libc::S_IFCHR | 0o600),
            Some(FileKind::CharDevice)
        );
        assert_eq!(kind_of_mode(0o644), None);
    }
}
