//! The values the door's handlers take and give, in the kernel's terms:
//! inode numbers, file handles, errnos, attributes, and the flag words of
//! opens, writes, renames and access checks. `abi.rs` declares the
//! kernel's structs these are read from and written into.

use std::time::SystemTime;

/// An inode number as the kernel knows it (`nodeid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct INodeNo(pub u64);

impl INodeNo {
    /// The mount's root, `FUSE_ROOT_ID`.
    pub const ROOT: INodeNo = INodeNo(1);
}

/// The handle an open's answer gave, which the kernel sends back with
/// each request on that open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle(pub u64);

/// An inode's generation, which tells apart two files that had one number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation(pub u64);

/// An error a request is answered with: a positive errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(i32);

impl Errno {
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const ERANGE: Errno = Errno(libc::ERANGE);

    /// Errno `n`; EIO for anything that is not one (0, a negative).
    pub fn from_i32(n: i32) -> Errno {
        match n > 0 {
            true => Errno(n),
            false => Errno::EIO,
        }
    }

    pub fn code(self) -> i32 {
        self.0
    }
}

/// A file's type, as `st_mode`'s format bits give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    NamedPipe,
    CharDevice,
    BlockDevice,
    Directory,
    RegularFile,
    Symlink,
    Socket,
}

/// A file's attributes as an answer gives them (`struct fuse_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileAttr {
    pub ino: INodeNo,
    pub size: u64,
    /// In 512-byte units.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
    pub kind: FileType,
    /// The permission bits, setuid, setgid and sticky among them.
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

/// A time a SETATTR sets: the one given, or the server's now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeOrNow {
    SpecificTime(SystemTime),
    Now,
}

/// An open's flags (`O_*`), as open(2) took them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFlags(pub i32);

/// What an open asks to do with the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum OpenAccMode {
    O_RDONLY,
    O_WRONLY,
    O_RDWR,
}

impl OpenFlags {
    /// The access mode; a word with both bits (which open(2) refuses) reads
    /// as read-only.
    pub fn acc_mode(self) -> OpenAccMode {
        match self.0 & libc::O_ACCMODE {
            libc::O_WRONLY => OpenAccMode::O_WRONLY,
            libc::O_RDWR => OpenAccMode::O_RDWR,
            _ => OpenAccMode::O_RDONLY,
        }
    }
}

bitflags::bitflags! {
    /// `FOPEN_*`: how the kernel may treat an open, in an open's answer.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct FopenFlags: u32 {
        const FOPEN_KEEP_CACHE = 1 << 1;
        const FOPEN_CACHE_DIR = 1 << 3;
        const FOPEN_NOFLUSH = 1 << 5;
        const FOPEN_PASSTHROUGH = 1 << 7;
    }

    /// `FUSE_WRITE_*`: what a WRITE says of itself.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct WriteFlags: u32 {
        const FUSE_WRITE_KILL_SUIDGID = 1 << 2;
    }

    /// `RENAME_*`: what renameat2(2) was asked.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct RenameFlags: u32 {
        const RENAME_NOREPLACE = libc::RENAME_NOREPLACE;
        const RENAME_EXCHANGE = libc::RENAME_EXCHANGE;
        const RENAME_WHITEOUT = libc::RENAME_WHITEOUT;
    }

    /// What access(2) asks (`R_OK`, `W_OK`, `X_OK`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct AccessFlags: i32 {
        const R_OK = libc::R_OK;
        const W_OK = libc::W_OK;
        const X_OK = libc::X_OK;
    }
}
