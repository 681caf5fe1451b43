//! Every NFSv3 procedure's arguments (RFC 1813 §3.3), decoded once, when
//! the call is placed on the connection's reader: the call, on whichever
//! thread runs it, and the reply cache read what was decoded here.
//!
//! Each length is checked against the bytes that follow it before anything
//! is taken, and nothing is copied or allocated: names, a WRITE's data and a
//! symlink's target are kept as [`Span`]s of the arguments, so the decode
//! borrows nothing from the record and travels with it to a worker. Each
//! handle is decoded and its MAC checked here, once ([`Checked`]). Trailing
//! bytes after the last field are ignored, as `nfs3_types` did. Hand-written
//! over the XDR cursor rather than `nfs3_types`, whose decoder copies every
//! handle and name into a buffer of its own and allocates what a length
//! claims before reading it (a 6-byte LINK claiming a 4 GiB name, found by
//! the `nfs_calls` fuzz target).

use layerfs_rpc::xdr::Cursor;
use layerfs_vfs::{Create, FileKind, SetAttr, SetTime, Stability, Timestamp};
use nfs3_types::nfs3::NFS3_FHSIZE;

use super::procedures::Proc;
use crate::error::Error;
use crate::handle::FileHandle;

/// A handle from a call's arguments, decoded and its MAC checked: the file
/// it names, or why it names none (BADHANDLE, STALE), answered when the
/// call runs.
pub type Checked = Result<FileHandle, Error>;

/// Where a name, a path or data lies in a call's arguments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    at: u32,
    len: u32,
}

impl Span {
    /// The bytes of `args`, the arguments this span was decoded from.
    pub fn of(self, args: &[u8]) -> &[u8] {
        let (at, len) = (self.at as usize, self.len as usize);
        args.get(at..at + len).unwrap_or_default()
    }

    pub fn len(self) -> usize {
        self.len as usize
    }
}

/// `diropargs3`: a directory and a name in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirOp {
    pub dir: Checked,
    pub name: Span,
}

/// What a MKNOD makes: the kind, its device numbers and attributes; `None`
/// for a type MKNOD does not make (regular file, directory, symlink),
/// answered BADTYPE.
pub type Node = Option<(FileKind, (u32, u32), SetAttr)>;

/// One call's arguments, by procedure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Args {
    Null,
    Getattr(Checked),
    Setattr {
        object: Checked,
        set: SetAttr,
        guard: Option<Timestamp>,
    },
    Lookup(DirOp),
    Access {
        object: Checked,
        asked: u32,
    },
    Readlink(Checked),
    Read {
        file: Checked,
        offset: u64,
        count: u32,
    },
    Write {
        file: Checked,
        offset: u64,
        stable: Stability,
        /// `count` bytes, or as many as were sent if fewer.
        data: Span,
    },
    Create {
        at: DirOp,
        how: Create,
    },
    Mkdir {
        at: DirOp,
        set: SetAttr,
    },
    Symlink {
        at: DirOp,
        set: SetAttr,
        target: Span,
    },
    Mknod {
        at: DirOp,
        node: Node,
    },
    Remove(DirOp),
    Rmdir(DirOp),
    Rename {
        from: DirOp,
        to: DirOp,
    },
    Link {
        file: Checked,
        at: DirOp,
    },
    Readdir {
        dir: Checked,
        cookie: u64,
        verf: [u8; 8],
        count: u32,
    },
    Readdirplus {
        dir: Checked,
        cookie: u64,
        verf: [u8; 8],
        /// The most bytes of names and cookies, and of the whole reply.
        dircount: u32,
        maxcount: u32,
    },
    Fsstat(Checked),
    Fsinfo(Checked),
    Pathconf(Checked),
    Commit {
        file: Checked,
        offset: u64,
        count: u32,
    },
}

/// A handle as it may appear in the arguments: the handle, and the name
/// after it where the two make a `diropargs3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleArg {
    pub handle: Checked,
    pub entry: Option<Span>,
}

impl Args {
    /// Decodes `proc`'s arguments; `check` decodes each handle, in order,
    /// and checks its MAC. `None`: malformed, answered GARBAGE_ARGS.
    pub fn decode(
        proc: Proc,
        args: &[u8],
        check: &mut impl FnMut(&[u8]) -> Checked,
    ) -> Option<Args> {
        let mut r = Reader {
            cursor: Cursor::new(args),
            check,
        };
        let r = &mut r;
        Some(match proc {
            Proc::Null => Args::Null,
            Proc::Getattr => Args::Getattr(r.handle()?),
            Proc::Setattr => Args::Setattr {
                object: r.handle()?,
                set: r.sattr()?,
                guard: if r.bool()? { Some(r.time()?) } else { None },
            },
            Proc::Lookup => Args::Lookup(r.dirop()?),
            Proc::Access => Args::Access {
                object: r.handle()?,
                asked: r.u32()?,
            },
            Proc::Readlink => Args::Readlink(r.handle()?),
            Proc::Read => Args::Read {
                file: r.handle()?,
                offset: r.u64()?,
                count: r.u32()?,
            },
            Proc::Write => {
                let file = r.handle()?;
                let offset = r.u64()?;
                let count = r.u32()?;
                let stable = match r.u32()? {
                    0 => Stability::Unstable,
                    1 => Stability::DataSync,
                    2 => Stability::FileSync,
                    _ => return None,
                };
                // Its padding may be missing from the end of the record.
                let mut data = r.span_unpadded()?;
                data.len = data.len.min(count);
                Args::Write {
                    file,
                    offset,
                    stable,
                    data,
                }
            }
            Proc::Create => Args::Create {
                at: r.dirop()?,
                how: match r.u32()? {
                    0 => Create::Unchecked(r.sattr()?),
                    1 => Create::Guarded(r.sattr()?),
                    2 => Create::Exclusive(r.cursor.take(8)?.try_into().ok()?),
                    _ => return None,
                },
            },
            Proc::Mkdir => Args::Mkdir {
                at: r.dirop()?,
                set: r.sattr()?,
            },
            Proc::Symlink => Args::Symlink {
                at: r.dirop()?,
                set: r.sattr()?,
                target: r.span()?,
            },
            Proc::Mknod => Args::Mknod {
                at: r.dirop()?,
                node: r.node()?,
            },
            Proc::Remove => Args::Remove(r.dirop()?),
            Proc::Rmdir => Args::Rmdir(r.dirop()?),
            Proc::Rename => Args::Rename {
                from: r.dirop()?,
                to: r.dirop()?,
            },
            Proc::Link => Args::Link {
                file: r.handle()?,
                at: r.dirop()?,
            },
            Proc::Readdir => Args::Readdir {
                dir: r.handle()?,
                cookie: r.u64()?,
                verf: r.cursor.take(8)?.try_into().ok()?,
                count: r.u32()?,
            },
            Proc::Readdirplus => Args::Readdirplus {
                dir: r.handle()?,
                cookie: r.u64()?,
                verf: r.cursor.take(8)?.try_into().ok()?,
                dircount: r.u32()?,
                maxcount: r.u32()?,
            },
            Proc::Fsstat => Args::Fsstat(r.handle()?),
            Proc::Fsinfo => Args::Fsinfo(r.handle()?),
            Proc::Pathconf => Args::Pathconf(r.handle()?),
            Proc::Commit => Args::Commit {
                file: r.handle()?,
                offset: r.u64()?,
                count: r.u32()?,
            },
        })
    }

    /// The handles, in order, each with the name after it in a
    /// `diropargs3`: what the call's placement asks the filesystem about.
    pub fn handles(&self) -> [Option<HandleArg>; 2] {
        let plain = |handle: Checked| {
            Some(HandleArg {
                handle,
                entry: None,
            })
        };
        let dirop = |d: &DirOp| {
            Some(HandleArg {
                handle: d.dir,
                entry: Some(d.name),
            })
        };
        match self {
            Args::Null => [None, None],
            Args::Getattr(h)
            | Args::Readlink(h)
            | Args::Fsstat(h)
            | Args::Fsinfo(h)
            | Args::Pathconf(h)
            | Args::Setattr { object: h, .. }
            | Args::Access { object: h, .. }
            | Args::Read { file: h, .. }
            | Args::Write { file: h, .. }
            | Args::Readdir { dir: h, .. }
            | Args::Readdirplus { dir: h, .. }
            | Args::Commit { file: h, .. } => [plain(*h), None],
            Args::Lookup(at)
            | Args::Remove(at)
            | Args::Rmdir(at)
            | Args::Create { at, .. }
            | Args::Mkdir { at, .. }
            | Args::Symlink { at, .. }
            | Args::Mknod { at, .. } => [dirop(at), None],
            Args::Rename { from, to } => [dirop(from), dirop(to)],
            Args::Link { file, at } => [plain(*file), dirop(at)],
        }
    }

    /// The file the call is on: its first handle's, when that one checked.
    pub fn first_file(&self) -> Option<FileHandle> {
        self.handles()[0].and_then(|h| h.handle.ok())
    }
}

/// The cursor over the arguments and the handle check.
struct Reader<'a, 'c, C> {
    cursor: Cursor<'a>,
    check: &'c mut C,
}

impl<C: FnMut(&[u8]) -> Checked> Reader<'_, '_, C> {
    fn u32(&mut self) -> Option<u32> {
        self.cursor.u32()
    }

    fn u64(&mut self) -> Option<u64> {
        self.cursor.u64()
    }

    /// An XDR bool: 0 or 1, nothing else.
    fn bool(&mut self) -> Option<bool> {
        match self.u32()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    /// `nfs_fh3`: at most 64 bytes, decoded and checked.
    fn handle(&mut self) -> Option<Checked> {
        let bytes = self.cursor.opaque(NFS3_FHSIZE)?;
        Some((self.check)(bytes))
    }

    /// A name, a path or data, of any length the record holds: a name past
    /// the protocol's limits gets its status (NAMETOOLONG) when the call
    /// runs, not GARBAGE_ARGS.
    fn span(&mut self) -> Option<Span> {
        let span = self.span_unpadded()?;
        self.cursor.take(layerfs_rpc::xdr::padding(span.len()))?;
        Some(span)
    }

    /// [`span`](Self::span) without its padding.
    fn span_unpadded(&mut self) -> Option<Span> {
        let len = self.u32()?;
        let at = u32::try_from(self.cursor.position()).ok()?;
        self.cursor.take(len as usize)?;
        Some(Span { at, len })
    }

    fn dirop(&mut self) -> Option<DirOp> {
        Some(DirOp {
            dir: self.handle()?,
            name: self.span()?,
        })
    }

    fn time(&mut self) -> Option<Timestamp> {
        Some(Timestamp {
            secs: i64::from(self.u32()?),
            nanos: self.u32()?.min(999_999_999),
        })
    }

    fn set_time(&mut self) -> Option<SetTime> {
        Some(match self.u32()? {
            0 => SetTime::Keep,
            1 => SetTime::ServerNow,
            2 => SetTime::Client(self.time()?),
            _ => return None,
        })
    }

    fn optional_u32(&mut self) -> Option<Option<u32>> {
        Some(if self.bool()? {
            Some(self.u32()?)
        } else {
            None
        })
    }

    /// `sattr3`.
    fn sattr(&mut self) -> Option<SetAttr> {
        Some(SetAttr {
            mode: self.optional_u32()?,
            uid: self.optional_u32()?,
            gid: self.optional_u32()?,
            size: if self.bool()? {
                Some(self.u64()?)
            } else {
                None
            },
            atime: self.set_time()?,
            mtime: self.set_time()?,
        })
    }

    /// `mknoddata3`.
    fn node(&mut self) -> Option<Node> {
        let device = |r: &mut Self, kind| {
            let set = r.sattr()?;
            Some(Some((kind, (r.u32()?, r.u32()?), set)))
        };
        match self.u32()? {
            // NF3REG, NF3DIR, NF3LNK
            1 | 2 | 5 => Some(None),
            3 => device(self, FileKind::BlockDevice),
            4 => device(self, FileKind::CharDevice),
            6 => Some(Some((FileKind::Socket, (0, 0), self.sattr()?))),
            7 => Some(Some((FileKind::Fifo, (0, 0), self.sattr()?))),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
