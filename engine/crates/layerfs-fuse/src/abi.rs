//! The kernel's FUSE structs the rings read and write, declared once as
//! they are in `include/uapi/linux/fuse.h` (protocol 7.41 and later): plain
//! `#[repr(C)]` integers in native byte order, read from and written into
//! the ring's buffers through zerocopy, never by byte offset.
//!
//! Each size is checked here against the kernel's header at compile time.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `struct fuse_in_header`: every request begins with it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct InHeader {
    /// The whole request's length, as it would be read from `/dev/fuse`.
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Extensions after the arguments, in units of 8 bytes.
    pub total_extlen: u16,
    pub padding: u16,
}

/// `struct fuse_out_header`: every answer begins with it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct OutHeader {
    /// The whole answer's length, this header included.
    pub len: u32,
    /// Negative errno, or 0.
    pub error: i32,
    pub unique: u64,
}

/// `struct fuse_init_in` since 7.36: the kernel's offer, `flags2`
/// holding the capabilities past bit 31 where `flags` has `INIT_EXT`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

/// `struct fuse_init_out`: the answer to an INIT. A kernel of minor
/// version below 23 reads only its first 24 bytes.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
    pub unused: [u16; 11],
}

/// The protocol version an INIT is answered with: `FUSE_KERNEL_VERSION`,
/// and the minor version the door has always answered (40), so that a
/// door taking a session over agrees to what the last one did.
pub const KERNEL_VERSION: u32 = 7;
pub const ANSWERED_MINOR_VERSION: u32 = 40;

/// `fuse_init_in`/`fuse_init_out` flags the door asks for (`FUSE_*`); bits
/// past 31 travel in `flags2`.
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const EXT: u64 = 1 << 30;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `struct fuse_notify_inval_inode_out`: drop the attributes and pages
/// the kernel holds of an inode (`off` -1 for the attributes alone).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct NotifyInvalInodeOut {
    pub ino: u64,
    pub off: i64,
    pub len: i64,
}

/// `struct fuse_notify_inval_entry_out`, followed by the name and a NUL.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct NotifyInvalEntryOut {
    pub parent: u64,
    pub namelen: u32,
    pub flags: u32,
}

/// `struct fuse_backing_map`: a host file to register for passthrough.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct BackingMap {
    pub fd: i32,
    pub flags: u32,
    pub padding: u64,
}

/// `struct fuse_read_in`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ReadIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_write_in`; the data follows as the payload.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct WriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_setattr_in`: `valid` names the fields to set (`FATTR_*`).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

/// `struct fuse_open_in`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct OpenIn {
    pub flags: u32,
    pub open_flags: u32,
}

/// `struct fuse_create_in`; the name follows.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CreateIn {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    pub open_flags: u32,
}

/// `struct fuse_release_in`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ReleaseIn {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

/// `struct fuse_getxattr_in`; the name follows.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct GetxattrIn {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_getattr_in`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct GetattrIn {
    pub getattr_flags: u32,
    pub dummy: u32,
    pub fh: u64,
}

/// `struct fuse_mknod_in`; the name follows. The kernel has applied the
/// caller's umask to `mode` already.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct MknodIn {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

/// `struct fuse_mkdir_in`; the name follows.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct MkdirIn {
    pub mode: u32,
    pub umask: u32,
}

/// `struct fuse_rename_in`; the old name and the new follow.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct RenameIn {
    pub newdir: u64,
}

/// `struct fuse_rename2_in`: a RENAME with flags (`RENAME_NOREPLACE`, ...).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Rename2In {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

/// `struct fuse_link_in`: the file to link; the header names the new
/// parent, and the new name follows.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct LinkIn {
    pub oldnodeid: u64,
}

/// `struct fuse_setxattr_in` as sent without `FUSE_SETXATTR_EXT` (the
/// door does not ask for it); the name and the value follow.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SetxattrIn {
    pub size: u32,
    pub flags: u32,
}

/// `struct fuse_access_in`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AccessIn {
    pub mask: u32,
    pub padding: u32,
}

/// `struct fuse_fsync_in` (FSYNC and FSYNCDIR).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct FsyncIn {
    pub fh: u64,
    /// `FUSE_FSYNC_FDATASYNC`: the data alone.
    pub fsync_flags: u32,
    pub padding: u32,
}

/// `struct fuse_fallocate_in`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

/// `struct fuse_attr` (Linux's).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    /// Seconds since the epoch; before it, negative (as `i64` bits).
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

/// `struct fuse_entry_out`: LOOKUP's and CREATE's first answer.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct EntryOut {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: Attr,
}

/// `struct fuse_attr_out`: GETATTR's and SETATTR's answer.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

/// `struct fuse_open_out`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

/// `struct fuse_write_out`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_getxattr_out`: the size an attribute's value needs.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct GetxattrOut {
    pub size: u32,
    pub padding: u32,
}

/// `struct fuse_statfs_out` (its `struct fuse_kstatfs`).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// `struct fuse_dirent`: one entry of a READDIR answer, its name after it
/// and the whole padded to 8 bytes.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct Dirent {
    pub ino: u64,
    /// The cookie to list on from.
    pub off: u64,
    pub namelen: u32,
    /// The file's type: its mode's `S_IFMT` bits shifted down by 12.
    pub typ: u32,
}

/// `struct fuse_direntplus`: an entry of a READDIRPLUS answer.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DirentPlus {
    pub entry_out: EntryOut,
    pub dirent: Dirent,
}

/// `enum fuse_notify_code`: a notification's code, in an out header's
/// `error` (its `unique` 0).
pub const NOTIFY_INVAL_INODE: i32 = 2;
pub const NOTIFY_INVAL_ENTRY: i32 = 3;
pub const NOTIFY_RESEND: i32 = 7;

/// `FUSE_FSYNC_FDATASYNC`, in `fuse_fsync_in`'s `fsync_flags`: an fsync of
/// the data alone.
pub const FSYNC_FDATASYNC: u32 = 1;

/// `FATTR_*`: which fields of `struct fuse_setattr_in` to set.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// `enum fuse_uring_cmd`.
pub const URING_CMD_REGISTER: u32 = 1;
pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;

/// The device's ioctls: `FUSE_DEV_IOC_CLONE`, `_IOR(229, 0, uint32_t)`,
/// `FUSE_DEV_IOC_BACKING_OPEN`, `_IOW(229, 1, struct fuse_backing_map)`,
/// and `FUSE_DEV_IOC_BACKING_CLOSE`, `_IOW(229, 2, uint32_t)`.
pub const DEV_IOC_CLONE: rustix::ioctl::Opcode = rustix::ioctl::opcode::read::<u32>(229, 0);
pub const DEV_IOC_BACKING_OPEN: rustix::ioctl::Opcode =
    rustix::ioctl::opcode::write::<BackingMap>(229, 1);
pub const DEV_IOC_BACKING_CLOSE: rustix::ioctl::Opcode =
    rustix::ioctl::opcode::write::<u32>(229, 2);

/// `enum fuse_opcode`: the requests the door is sent. Those it never is
/// (it asks for no locks, no `poll`, ...) are answered ENOSYS wherever
/// they come from.
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
}

/// `FUSE_URING_IN_OUT_HEADER_SZ` and `FUSE_URING_OP_IN_OUT_SZ`.
pub const URING_HEADER_SZ: usize = 128;

/// `struct fuse_uring_ent_in_out`: what the kernel and the ring tell each
/// other of one request besides its headers.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct UringEntInOut {
    pub flags: u64,
    /// Given back with the answer (COMMIT_AND_FETCH).
    pub commit_id: u64,
    /// The payload's length: the request's, then the answer's.
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: a ring slot's header buffer. The in
/// header, then the out header, share `in_out`; the operation's own
/// arguments are in `op_in`.
#[derive(Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct UringReqHeader {
    pub in_out: [u8; URING_HEADER_SZ],
    pub op_in: [u8; URING_HEADER_SZ],
    pub ent: UringEntInOut,
}

/// `struct fuse_uring_cmd_req`: the command bytes of a REGISTER or a
/// COMMIT_AND_FETCH.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct UringCmdReq {
    pub flags: u64,
    pub commit_id: u64,
    pub qid: u16,
    pub padding: [u8; 6],
}

// The sizes `fuse.h` gives them.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<InHeader>() == 40);
    assert!(size_of::<OutHeader>() == 16);
    assert!(size_of::<InitIn>() == 64);
    assert!(size_of::<InitOut>() == 64);
    assert!(size_of::<NotifyInvalInodeOut>() == 24);
    assert!(size_of::<NotifyInvalEntryOut>() == 16);
    assert!(size_of::<BackingMap>() == 16);
    assert!(size_of::<ReadIn>() == 40);
    assert!(size_of::<WriteIn>() == 40);
    assert!(size_of::<SetattrIn>() == 88);
    assert!(size_of::<OpenIn>() == 8);
    assert!(size_of::<CreateIn>() == 16);
    assert!(size_of::<ReleaseIn>() == 24);
    assert!(size_of::<GetxattrIn>() == 8);
    assert!(size_of::<GetattrIn>() == 16);
    assert!(size_of::<MknodIn>() == 16);
    assert!(size_of::<MkdirIn>() == 8);
    assert!(size_of::<RenameIn>() == 8);
    assert!(size_of::<Rename2In>() == 16);
    assert!(size_of::<LinkIn>() == 8);
    assert!(size_of::<SetxattrIn>() == 8);
    assert!(size_of::<AccessIn>() == 8);
    assert!(size_of::<FsyncIn>() == 16);
    assert!(size_of::<FallocateIn>() == 32);
    assert!(size_of::<StatfsOut>() == 80);
    assert!(size_of::<Dirent>() == 24);
    assert!(size_of::<DirentPlus>() == 152);
    assert!(size_of::<Attr>() == 88);
    assert!(size_of::<EntryOut>() == 128);
    assert!(size_of::<AttrOut>() == 104);
    assert!(size_of::<OpenOut>() == 16);
    assert!(size_of::<WriteOut>() == 8);
    assert!(size_of::<GetxattrOut>() == 8);
    assert!(size_of::<UringEntInOut>() == 32);
    assert!(size_of::<UringReqHeader>() == 288);
    assert!(size_of::<UringCmdReq>() == 24);
};

/// The arguments `T` at the start of `bytes`, if there are enough of them.
pub fn args<T: FromBytes>(bytes: &[u8]) -> Option<T> {
    T::read_from_prefix(bytes).ok().map(|(t, _)| t)
}
