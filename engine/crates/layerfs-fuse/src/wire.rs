//! Requests answered in the kernel's own layout (`include/uapi/linux/fuse.h`),
//! whichever route brought them: `/dev/fuse` ([`crate::devfuse`]) or a
//! CPU's ring ([`crate::uring`]). A header and its arguments in, an
//! answer's bytes out; no I/O here.
//!
//! Each request is read once into a typed [`Request`] and handed to the
//! door's handler for it; the answer is written as the kernel reads it
//! ([`reply`]).

use crate::types::{
    AccessFlags, Errno, FileHandle, INodeNo, OpenFlags, RenameFlags, TimeOrNow, WriteFlags,
};
use layerfs_vfs::SetAttr;

use crate::abi::{fattr, SetattrIn, FSYNC_FDATASYNC};
pub use crate::abi::{InHeader, OutHeader};
use crate::answer::{Answer, EmptyAnswer};
use crate::door::{set_time, wanted, Door, Who};
pub use crate::request::Body;
use crate::request::Request;
use reply::{Listing, Reply};

mod reply;

/// `struct fuse_in_header`'s length.
pub const IN_HEADER_LEN: usize = std::mem::size_of::<InHeader>();
/// `struct fuse_out_header`'s length.
pub const OUT_HEADER_LEN: usize = std::mem::size_of::<OutHeader>();

/// One answer: an error, or a body (possibly empty).
#[derive(Debug, Default)]
pub struct Answered {
    /// Negative errno, or 0.
    pub error: i32,
    pub body: Vec<u8>,
}

/// The out header of an answer of `body` bytes, or of error `error`
/// (negative).
pub fn out_header(unique: u64, error: i32, body: usize) -> OutHeader {
    OutHeader {
        len: (OUT_HEADER_LEN + body) as u32,
        error,
        unique,
    }
}

/// What a SETATTR asks to set: the change time, the
/// file handle and FATTR_KILL_SUIDGID are not the door's to use.
fn setattr_in(op: &SetattrIn) -> SetAttr {
    let has = |bit: u32| op.valid & bit != 0;
    let time = |bit: u32, now: u32, secs: u64, nanos: u32| {
        set_time(has(bit).then(|| match has(now) {
            true => TimeOrNow::Now,
            false => TimeOrNow::SpecificTime(reply::system_time(secs as i64, nanos)),
        }))
    };
    SetAttr {
        mode: has(fattr::MODE).then_some(op.mode),
        uid: has(fattr::UID).then_some(op.uid),
        gid: has(fattr::GID).then_some(op.gid),
        size: has(fattr::SIZE).then_some(op.size),
        atime: time(fattr::ATIME, fattr::ATIME_NOW, op.atime, op.atimensec),
        mtime: time(fattr::MTIME, fattr::MTIME_NOW, op.mtime, op.mtimensec),
    }
}

/// Answers READ `read` of `h` by reading the file straight into `dst`, the
/// buffer the answer goes out from: the answer's errno (negative, or 0)
/// and length. None for a READ [`answer`] must answer (a file open
/// with no name left).
pub fn read_direct(
    door: &Door,
    h: &InHeader,
    read: &crate::abi::ReadIn,
    dst: &mut [u8],
) -> Option<(i32, usize)> {
    let size = (read.size as usize).min(dst.len());
    match door.read_into(INodeNo(h.nodeid), read.offset, &mut dst[..size])? {
        Ok(len) => Some((0, len)),
        Err(e) => Some((-e.code(), 0)),
    }
}

/// Answers request `h`, decoded as `request` (once, by the route that
/// read it: [`Request::parse`]), with `door` into `out`. Every request gets
/// an answer: one that cannot be decoded gets its errno, one the door does
/// not serve ENOSYS.
pub fn answer(door: &Door, h: &InHeader, request: Result<Request<'_>, Errno>, out: &mut Answered) {
    out.error = 0;
    out.body.clear();
    let who = Who {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    let ino = INodeNo(h.nodeid);
    let reply = Reply(out);
    let request = match request {
        Ok(request) => request,
        Err(e) => return reply.error(e),
    };
    match request {
        Request::Lookup { name } => door.lookup_as(who, ino, name, reply),
        Request::Getattr => door.getattr_as(ino, reply),
        Request::Setattr(set) => door.setattr_as(who, ino, setattr_in(&set), reply),
        Request::Readlink => door.readlink_as(who, ino, reply),
        Request::Symlink { name, target } => door.symlink_as(who, ino, name, target, reply),
        Request::Mknod { arg, name } => door.mknod_as(who, ino, name, (arg.mode, arg.rdev), reply),
        Request::Mkdir { arg, name } => door.mkdir_as(who, ino, name, arg.mode, reply),
        Request::Unlink { name } => door.unlink_as(who, ino, name, reply),
        Request::Rmdir { name } => door.rmdir_as(who, ino, name, reply),
        Request::Rename {
            newdir,
            flags,
            name,
            newname,
        } => {
            let flags = RenameFlags::from_bits_retain(flags);
            door.rename_as(who, (ino, name), (INodeNo(newdir), newname), flags, reply)
        }
        Request::Link { oldnodeid, name } => {
            door.link_as(who, INodeNo(oldnodeid), (ino, name), reply)
        }
        Request::Open(open) => door.open_as(who, ino, OpenFlags(open.flags as i32), reply),
        Request::Read(read) => door.read_as(ino, read.offset, read.size, reply),
        Request::Write { arg, data } => {
            let write_flags = WriteFlags::from_bits_retain(arg.write_flags);
            let flags = OpenFlags(arg.flags as i32);
            door.write_as(ino, arg.offset, data, write_flags, flags, reply)
        }
        Request::Statfs => door.statfs_as(ino, reply),
        Request::Release(release) => door.release_as(ino, FileHandle(release.fh), reply),
        Request::Fsync(fsync) => {
            door.fsync_as(ino, fsync.fsync_flags & FSYNC_FDATASYNC != 0, reply)
        }
        Request::Setxattr { flags, name, value } => {
            door.setxattr_as(ino, (name, value), flags as i32, reply)
        }
        Request::Getxattr { size, name } => door.getxattr_as(ino, name, size, reply),
        Request::Listxattr { size } => door.listxattr_as(ino, size, reply),
        Request::Removexattr { name } => door.removexattr_as(ino, name, reply),
        Request::Flush => door.flush_as(reply),
        Request::Opendir => door.opendir_as(reply),
        Request::Readdir(read) => {
            door.readdir_as(who, ino, read.offset, Listing::new(out, read.size))
        }
        Request::Readdirplus(read) => {
            door.readdirplus_as(who, ino, read.offset, Listing::new(out, read.size))
        }
        Request::Releasedir => reply.ok(),
        Request::Access(access) => {
            let mask = AccessFlags::from_bits_retain(access.mask as i32);
            door.access_as(who, ino, wanted(mask), reply)
        }
        Request::Create { arg, name } => {
            door.create_as(who, ino, name, arg.mode, arg.flags as i32, reply)
        }
        Request::Ioctl => door.ioctl_as(reply),
        Request::Fallocate(f) => door.fallocate_as(ino, (f.offset, f.length), f.mode as i32, reply),
        Request::Other(opcode) => {
            tracing::debug!(opcode, "a FUSE request the door does not serve: ENOSYS");
            reply.error(Errno::ENOSYS)
        }
    }
}

#[cfg(test)]
mod tests;
