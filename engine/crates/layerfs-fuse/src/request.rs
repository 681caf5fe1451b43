//! A FUSE request's arguments, read once into a typed [`Request`] from the
//! bytes the kernel wrote after `struct fuse_in_header`. Sans-IO: bytes in,
//! a request or an errno out.
//!
//! The kernel lays the arguments out two ways. Through `/dev/fuse` they
//! follow one another in one buffer. Through a ring
//! (`fs/fuse/dev_uring.c`) the first argument, the operation's own struct,
//! goes to the slot's `op_in` header and every other (names, a WRITE's
//! data) to its payload; a request without such a struct (LOOKUP, UNLINK)
//! has an empty first argument there. [`Body`] reads both alike.

use crate::types::Errno;
use zerocopy::FromBytes;

use crate::abi::{
    opcode as op, AccessIn, CreateIn, FallocateIn, FsyncIn, GetxattrIn, LinkIn, MkdirIn, MknodIn,
    OpenIn, ReadIn, ReleaseIn, Rename2In, RenameIn, SetattrIn, SetxattrIn, WriteIn,
};
use crate::limits::MAX_WRITE;

/// A request's argument bytes: `op` first, then `rest`.
#[derive(Clone, Copy, Debug)]
pub struct Body<'a> {
    op: &'a [u8],
    rest: &'a [u8],
}

impl<'a> Body<'a> {
    /// The arguments a ring holds: the slot's `op_in` bytes and its payload,
    /// without the `extensions` (8-byte units) the kernel appends last.
    pub fn split(op: &'a [u8], payload: &'a [u8], extensions: u16) -> Body<'a> {
        let ext = 8 * usize::from(extensions);
        match payload.is_empty() {
            false => Body {
                op,
                rest: &payload[..payload.len().saturating_sub(ext)],
            },
            true => Body {
                op: &op[..op.len().saturating_sub(ext)],
                rest: payload,
            },
        }
    }

    /// The arguments as `/dev/fuse` gives them, in one buffer, without
    /// the `extensions` (8-byte units) the kernel appends last.
    pub fn whole(bytes: &'a [u8], extensions: u16) -> Body<'a> {
        let ext = 8 * usize::from(extensions);
        Body {
            op: &bytes[..bytes.len().saturating_sub(ext)],
            rest: &[],
        }
    }

    /// The operation's struct `T`, and the bytes after it.
    fn fixed<T: FromBytes>(self) -> Result<(T, &'a [u8]), Errno> {
        let (t, after) = T::read_from_prefix(self.op).map_err(|_| Errno::EIO)?;
        Ok((t, self.after(after)))
    }

    /// The arguments of a request with no struct of its own.
    fn bare(self) -> &'a [u8] {
        self.after(self.op)
    }

    fn after(self, in_op: &'a [u8]) -> &'a [u8] {
        match in_op.is_empty() {
            true => self.rest,
            false => in_op,
        }
    }
}

/// One request, its arguments typed; the header (node, caller) aside.
#[derive(Clone, Copy, Debug)]
pub enum Request<'a> {
    Lookup {
        name: &'a [u8],
    },
    Getattr,
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        arg: MknodIn,
        name: &'a [u8],
    },
    Mkdir {
        arg: MkdirIn,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    /// RENAME, or RENAME2 with its flags.
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnodeid: u64,
        name: &'a [u8],
    },
    Open(OpenIn),
    Read(ReadIn),
    Write {
        arg: WriteIn,
        data: &'a [u8],
    },
    Statfs,
    Release(ReleaseIn),
    /// FSYNC, or FSYNCDIR.
    Fsync(FsyncIn),
    Setxattr {
        flags: u32,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Flush,
    Opendir,
    Readdir(ReadIn),
    Readdirplus(ReadIn),
    Releasedir,
    Access(AccessIn),
    Create {
        arg: CreateIn,
        name: &'a [u8],
    },
    Ioctl,
    Fallocate(FallocateIn),
    /// A request the door does not serve: answered ENOSYS, after which
    /// the kernel sends no more of most of them.
    Other(u32),
}

impl<'a> Request<'a> {
    /// Reads request `opcode`'s arguments from `body`: EIO where its
    /// struct is cut short (the kernel never sends that), EINVAL where a
    /// name is missing its end or is empty.
    pub fn parse(opcode: u32, body: Body<'a>) -> Result<Request<'a>, Errno> {
        Ok(match opcode {
            op::LOOKUP => Request::Lookup {
                name: name(body.bare())?.0,
            },
            op::GETATTR => Request::Getattr,
            op::SETATTR => Request::Setattr(body.fixed()?.0),
            op::READLINK => Request::Readlink,
            op::SYMLINK => {
                let (name, after) = name(body.bare())?;
                let (target, _) = name_of(after)?;
                Request::Symlink { name, target }
            }
            op::MKNOD => {
                let (arg, after) = body.fixed()?;
                let name = name(after)?.0;
                Request::Mknod { arg, name }
            }
            op::MKDIR => {
                let (arg, after) = body.fixed()?;
                let name = name(after)?.0;
                Request::Mkdir { arg, name }
            }
            op::UNLINK => Request::Unlink {
                name: name(body.bare())?.0,
            },
            op::RMDIR => Request::Rmdir {
                name: name(body.bare())?.0,
            },
            op::RENAME => {
                let (arg, after): (RenameIn, _) = body.fixed()?;
                rename(arg.newdir, 0, after)?
            }
            op::RENAME2 => {
                let (arg, after): (Rename2In, _) = body.fixed()?;
                rename(arg.newdir, arg.flags, after)?
            }
            op::LINK => {
                let (arg, after): (LinkIn, _) = body.fixed()?;
                let name = name(after)?.0;
                Request::Link {
                    oldnodeid: arg.oldnodeid,
                    name,
                }
            }
            op::OPEN => Request::Open(body.fixed()?.0),
            op::READ => Request::Read(read_in(body)?),
            op::WRITE => {
                let (arg, data): (WriteIn, _) = body.fixed()?;
                let data = &data[..data.len().min(arg.size as usize)];
                Request::Write { arg, data }
            }
            op::STATFS => Request::Statfs,
            op::RELEASE => Request::Release(body.fixed()?.0),
            op::FSYNC | op::FSYNCDIR => Request::Fsync(body.fixed()?.0),
            op::SETXATTR => {
                let (arg, after): (SetxattrIn, _) = body.fixed()?;
                let (name, value) = name(after)?;
                // The value's length is the struct's; a shorter one is cut.
                let value = value.get(..arg.size as usize).ok_or(Errno::EIO)?;
                Request::Setxattr {
                    flags: arg.flags,
                    name,
                    value,
                }
            }
            op::GETXATTR => {
                let (arg, after): (GetxattrIn, _) = body.fixed()?;
                let name = name(after)?.0;
                Request::Getxattr {
                    size: arg.size,
                    name,
                }
            }
            op::LISTXATTR => {
                let (arg, _): (GetxattrIn, _) = body.fixed()?;
                Request::Listxattr { size: arg.size }
            }
            op::REMOVEXATTR => Request::Removexattr {
                name: name(body.bare())?.0,
            },
            op::FLUSH => Request::Flush,
            op::OPENDIR => {
                body.fixed::<OpenIn>()?;
                Request::Opendir
            }
            op::READDIR => Request::Readdir(body.fixed()?.0),
            op::READDIRPLUS => Request::Readdirplus(body.fixed()?.0),
            op::RELEASEDIR => Request::Releasedir,
            op::ACCESS => Request::Access(body.fixed()?.0),
            op::CREATE => {
                let (arg, after) = body.fixed()?;
                let name = name(after)?.0;
                Request::Create { arg, name }
            }
            op::IOCTL => Request::Ioctl,
            op::FALLOCATE => Request::Fallocate(body.fixed()?.0),
            other => Request::Other(other),
        })
    }
}

/// A READ's arguments, its size cut to [`MAX_WRITE`]: the door lets the
/// kernel send no larger READ (`max_pages`), and a larger one must not
/// make the answer's buffer grow past what the kernel would take.
fn read_in(body: Body<'_>) -> Result<ReadIn, Errno> {
    let mut read: ReadIn = body.fixed()?.0;
    read.size = read.size.min(MAX_WRITE);
    Ok(read)
}

fn rename(newdir: u64, flags: u32, names: &[u8]) -> Result<Request<'_>, Errno> {
    let (old, after) = name(names)?;
    let (new, _) = name(after)?;
    Ok(Request::Rename {
        newdir,
        flags,
        name: old,
        newname: new,
    })
}

/// A name: the bytes before its NUL, not empty; and what follows the NUL.
fn name(bytes: &[u8]) -> Result<(&[u8], &[u8]), Errno> {
    let (name, after) = name_of(bytes)?;
    match name.is_empty() {
        true => Err(Errno::EINVAL),
        false => Ok((name, after)),
    }
}

/// The bytes before the first NUL, and those after it.
fn name_of(bytes: &[u8]) -> Result<(&[u8], &[u8]), Errno> {
    let end = bytes.iter().position(|&b| b == 0).ok_or(Errno::EINVAL)?;
    Ok((&bytes[..end], &bytes[end + 1..]))
}

#[cfg(test)]
mod tests;
