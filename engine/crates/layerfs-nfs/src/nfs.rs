//! NFS version 3 (RFC 1813): the 22 procedures over the exported filesystem.

use std::sync::{Arc, LazyLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::access::granted;
use layerfs_rpc::{
    xdr, Call, Credentials, Decoded, DecodedArgs, FileTail, Placement, Program, Refusal, ReplyBuf,
};
use layerfs_vfs::{Attr, Caller, Change, Create, FileId, FileKind, SetAttr, Stability, Timestamp};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Pack};

use crate::convert::{fattr, post_op, wcc, wcc_after};
use crate::drc::{Begun, ReplyCache};
use crate::error::{status, Error};
use crate::export::{Export, Exports};
use crate::handle::Checked;
use crate::{NFS_PROGRAM, NFS_VERSION};

mod args;
mod listing;
mod procedures;

use args::{Args, DirOp, Node, Span};
use procedures::Proc;

/// Largest READ and WRITE; the Linux client uses it as rsize and wsize.
pub const MAX_TRANSFER: u32 = 1024 * 1024;
/// READs from this size up are sent from the file by the kernel; below it a
/// copy costs less than breaking the batch of replies around it.
const SEND_FILE_FROM: usize = 16 * 1024;
/// Preferred READDIR size.
const DIR_PREF: u32 = 64 * 1024;
/// FSINFO properties: LINK, SYMLINK, HOMOGENEOUS, CANSETTIME.
const PROPERTIES: u32 = 0x0001 | 0x0002 | 0x0008 | 0x0010;
const REPLY_CACHE_ENTRIES: usize = 4096;

/// NFS version 3 over the exports of one server.
pub struct NfsProgram {
    exports: Arc<Exports>,
    /// One per server instance, the same in WRITE and COMMIT: a new one after
    /// a restart tells clients to resend what they wrote unstably.
    write_verf: writeverf3,
    cache: ReplyCache,
}

impl NfsProgram {
    pub fn new(exports: Arc<Exports>) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let verf = (now.as_nanos() as u64) ^ (u64::from(std::process::id()) << 48);
        NfsProgram {
            exports,
            write_verf: writeverf3(verf.to_be_bytes()),
            cache: ReplyCache::new(REPLY_CACHE_ENTRIES),
        }
    }

    /// Which thread runs a call: what the procedure table says, where the
    /// filesystem finds every handle's file without walking the tree for it
    /// and copies nothing up; a SETATTR that sets a size only when the
    /// connection is idle (a truncation frees pages in time that grows with
    /// the file); a WRITE only when it asks for no fsync; a listing only
    /// when the filesystem has it at hand (a directory listed lately: no
    /// host call per entry, where a cold one could read thousands of
    /// inodes from disk). A call whose handle is bad is answered at once.
    fn placement(&self, proc: Proc, a: &CallArgs, bytes: &[u8]) -> Placement {
        let runs = match a.args {
            Args::Setattr { set, .. } if set.size.is_some() => Placement::ReaderWhenIdle,
            Args::Write {
                stable: Stability::Unstable,
                data,
                ..
            } if data.len() <= MAX_TRANSFER as usize => proc.runs(),
            Args::Write { .. } => Placement::Worker,
            _ => proc.runs(),
        };
        let Ok(export) = &a.export else {
            return Placement::Reader;
        };
        if runs == Placement::Worker {
            return runs;
        }
        let hints = export.fs.hints();
        let lists = match a.args {
            Args::Readdir { .. } => Some(false),
            Args::Readdirplus { .. } => Some(true),
            _ => None,
        };
        let at_hand = a.args.handles().into_iter().flatten().all(|h| {
            let Ok(fh) = h.handle else {
                return true;
            };
            let entry = h.entry.map(|name| name.of(bytes));
            hints.knows(fh.fileid)
                && !(proc.copies_up() && hints.may_copy_up(fh.fileid, entry))
                && lists.is_none_or(|with_attrs| hints.lists_at_hand(fh.fileid, with_attrs))
        });
        if at_hand {
            runs
        } else {
            Placement::Worker
        }
    }
}

/// A call's arguments, decoded once by [`NfsProgram::decode`]: the export
/// its first handle names and the procedure's arguments, each handle in
/// them checked against that export.
struct CallArgs {
    export: Result<Arc<Export>, Error>,
    args: Args,
}

/// A failure reply that carries no attributes: the status, then FALSE for
/// each of the procedure's optional attributes.
fn fail_without_attributes(proc: Proc, e: Error, reply: &mut ReplyBuf) -> Result<(), Refusal> {
    put(reply, &status(e))?;
    for _ in 0..proc.optional_attributes_on_failure() {
        put(reply, &false)?;
    }
    Ok(())
}

/// One call's export, which its procedure runs against.
struct Served<'a> {
    export: &'a Export,
    write_verf: writeverf3,
}

impl Served<'_> {
    fn fsid(&self) -> u64 {
        self.export.id
    }

    fn attr_of(&self, id: FileId) -> Option<Attr> {
        self.export.fs.getattr(id).ok()
    }

    fn run(&self, call: &Call<'_>, args: &Args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let who = self.export.caller(call.cred);
        let bytes = call.args;
        // A name, a path or data, as the decode found it in the arguments.
        let arg = |s: Span| s.of(bytes);
        match *args {
            Args::Null => Ok(()),
            Args::Getattr(fh) => self.getattr(fh, reply),
            Args::Setattr { object, set, guard } => self.setattr(&who, (object, set, guard), reply),
            Args::Lookup(at) => self.lookup(&who, (at.dir, arg(at.name)), reply),
            Args::Access { object, asked } => self.access(&who, (object, asked), reply),
            Args::Readlink(fh) => self.readlink(&who, fh, reply),
            Args::Read {
                file,
                offset,
                count,
            } => self.read(&who, (file, offset, count), reply),
            Args::Write {
                file,
                offset,
                stable,
                data,
            } => self.write(&who, (file, offset, stable, arg(data)), reply),
            Args::Create { at, how } => self.create(&who, (at, arg(at.name)), how, reply),
            Args::Mkdir { at, set } => self.mkdir(&who, (at, arg(at.name)), set, reply),
            Args::Symlink { at, set, target } => {
                let target = arg(target);
                self.symlink(&who, (at, arg(at.name)), set, target, reply)
            }
            Args::Mknod { at, node } => self.mknod(&who, (at, arg(at.name)), node, reply),
            Args::Remove(at) => self.remove(&who, (at, arg(at.name)), reply, false),
            Args::Rmdir(at) => self.remove(&who, (at, arg(at.name)), reply, true),
            Args::Rename { from, to } => {
                let names = (arg(from.name), arg(to.name));
                self.rename(&who, (from, to), names, reply)
            }
            Args::Link { file, at } => self.link(&who, file, (at, arg(at.name)), reply),
            Args::Readdir {
                dir,
                cookie,
                verf,
                count,
            } => self.readdir(&who, (dir, (cookie, verf), count), reply),
            Args::Readdirplus {
                dir,
                cookie,
                verf,
                dircount,
                maxcount,
            } => self.readdirplus(&who, (dir, (cookie, verf), (maxcount, dircount)), reply),
            Args::Fsstat(fh) => self.fsstat(fh, reply),
            Args::Fsinfo(fh) => self.fsinfo(fh, reply),
            Args::Pathconf(fh) => self.pathconf(fh, reply),
            Args::Commit { file, .. } => self.commit(file, reply),
        }
    }

    fn getattr(&self, fh: Checked, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let res: GETATTR3res = match self.export.resolve(fh) {
            Ok((_, attr)) => Nfs3Result::Ok(GETATTR3resok {
                obj_attributes: fattr(&attr, self.fsid()),
            }),
            Err(e) => Nfs3Result::Err((status(e), nfs3_types::xdr_codec::Void)),
        };
        put(reply, &res)
    }

    fn setattr(
        &self,
        who: &Caller,
        (object, set, guard): (Checked, SetAttr, Option<Timestamp>),
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self
            .export
            .on(object, |id| self.export.fs.setattr(who, id, &set, guard));
        let res: SETATTR3res = match result {
            Ok(change) => Nfs3Result::Ok(SETATTR3resok {
                obj_wcc: wcc(&change, self.fsid()),
            }),
            Err(e) => {
                let after = self.export.attr_after(object);
                Nfs3Result::Err((
                    status(e),
                    SETATTR3resfail {
                        obj_wcc: wcc_after(after.as_ref(), self.fsid()),
                    },
                ))
            }
        };
        put(reply, &res)
    }

    fn lookup(
        &self,
        who: &Caller,
        (dir, name): (Checked, &[u8]),
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let fs = &self.export.fs;
        let (e, dir_attr) = match self.export.on_read(dir, |dir| fs.lookup_in(who, dir, name)) {
            Ok((Ok(attr), dir_attr)) => {
                // LOOKUP3resok field by field: its `nfs_fh3` would copy the
                // handle into a buffer of its own.
                put(reply, &nfsstat3::NFS3_OK)?;
                put(reply, &Opaque::borrowed(&self.export.handle_bytes(&attr)))?;
                put(reply, &post_op(Some(&attr), self.fsid()))?;
                return put(reply, &post_op(Some(&dir_attr), self.fsid()));
            }
            Ok((Err(missing), dir_attr)) => (missing.into(), Some(dir_attr)),
            Err(failed) => failed,
        };
        put(reply, &status(e))?;
        put(reply, &post_op(dir_attr.as_ref(), self.fsid()))
    }

    fn access(
        &self,
        who: &Caller,
        (fh, asked): (Checked, u32),
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let res: ACCESS3res = match self.export.resolve(fh) {
            Ok((_, attr)) => Nfs3Result::Ok(ACCESS3resok {
                obj_attributes: post_op(Some(&attr), self.fsid()),
                access: granted(&attr, who, asked),
            }),
            Err(e) => Nfs3Result::Err((
                status(e),
                ACCESS3resfail {
                    obj_attributes: Nfs3Option::None,
                },
            )),
        };
        put(reply, &res)
    }

    fn readlink(&self, who: &Caller, fh: Checked, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let result = self
            .export
            .resolve(fh)
            .and_then(|(id, attr)| Ok((self.export.fs.readlink(who, id)?, attr)));
        let res: READLINK3res<'_> = match result {
            Ok((target, attr)) => Nfs3Result::Ok(READLINK3resok {
                symlink_attributes: post_op(Some(&attr), self.fsid()),
                data: nfspath3(Opaque::owned(target)),
            }),
            Err(e) => Nfs3Result::Err((
                status(e),
                READLINK3resfail {
                    symlink_attributes: Nfs3Option::None,
                },
            )),
        };
        put(reply, &res)
    }

    /// A large READ leaves the data in the file: the reply ends in a file tail
    /// the kernel sends from the page cache. A small one reads the file
    /// straight into the reply: the header is reserved first and filled in
    /// once the data's length and the attributes are known.
    fn read(
        &self,
        who: &Caller,
        (file, offset, count): (Checked, u64, u32),
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let count = count.min(MAX_TRANSFER) as usize;
        let resolved = self.export.resolve(file);
        let (id, attr) = match resolved {
            Ok(found) => found,
            Err(e) => return put(reply, &read_fail(e, None, self.fsid())),
        };
        if count >= SEND_FILE_FROM {
            let source = match self.export.fs.host_files() {
                Some(files) => files.read_source(who, id, offset, count),
                None => Ok(None),
            };
            match source {
                Ok(Some(src)) => {
                    read_header(reply, &src.attr, self.fsid(), src.len, src.eof)?;
                    reply.set_file_tail(FileTail {
                        file: src.file,
                        offset: src.offset,
                        len: src.len,
                    });
                    return Ok(());
                }
                Ok(None) => {}
                Err(e) => return put(reply, &read_fail(e, Some(&attr), self.fsid())),
            }
        }
        // Room for the header, written once the data is in.
        let header_at = reply.body_len();
        reply.append_with(|body| body.resize(body.len() + *READ_HEADER_LEN, 0));
        let data_at = reply.body_len();
        reply.reserve(count + 4);
        let read = reply.append_with(|body| self.export.fs.read(who, id, offset, count, body));
        match read {
            Ok((eof, attr)) => {
                let n = reply.body_len() - data_at;
                reply.extend_from_slice(&[0; 3][..xdr::padding(n)]);
                let mut header = Vec::with_capacity(data_at - header_at);
                read_header(&mut header, &attr, self.fsid(), n, eof)?;
                assert_eq!(header.len(), data_at - header_at, "a READ header's size");
                reply.patch_body(header_at, &header);
                Ok(())
            }
            Err(e) => {
                reply.truncate_body(header_at);
                put(reply, &read_fail(e, Some(&attr), self.fsid()))
            }
        }
    }

    fn write(
        &self,
        who: &Caller,
        (file, offset, stable, data): (Checked, u64, Stability, &[u8]),
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self.export.on(file, |id| {
            self.export.fs.write(who, id, offset, data, stable)
        });
        let res: WRITE3res = match result {
            Ok((change, done)) => Nfs3Result::Ok(WRITE3resok {
                file_wcc: wcc(&change, self.fsid()),
                count: data.len() as u32,
                committed: match done {
                    Stability::Unstable => stable_how::UNSTABLE,
                    Stability::DataSync => stable_how::DATA_SYNC,
                    Stability::FileSync => stable_how::FILE_SYNC,
                },
                verf: self.write_verf,
            }),
            Err(e) => {
                let after = self.export.attr_after(file);
                Nfs3Result::Err((
                    status(e),
                    WRITE3resfail {
                        file_wcc: wcc_after(after.as_ref(), self.fsid()),
                    },
                ))
            }
        };
        put(reply, &res)
    }

    /// The common end of CREATE, MKDIR, SYMLINK and MKNOD, whose results
    /// share one shape: new handle, its attributes, the directory's change.
    fn made(
        &self,
        dir: Checked,
        result: Result<(Attr, Change), Error>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        match result {
            Ok((attr, change)) => {
                put(reply, &nfsstat3::NFS3_OK)?;
                put(reply, &post_op_fh3::Some(self.export.handle(&attr)))?;
                put(reply, &post_op(Some(&attr), self.fsid()))?;
                put(reply, &wcc(&change, self.fsid()))
            }
            Err(e) => self.dir_fail(e, dir, reply),
        }
    }

    /// A failed change to a directory: status and what the directory is now.
    fn dir_fail(&self, e: Error, dir: Checked, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let after = self.export.attr_after(dir);
        put(reply, &status(e))?;
        put(reply, &wcc_after(after.as_ref(), self.fsid()))
    }

    fn create(
        &self,
        who: &Caller,
        (at, name): (DirOp, &[u8]),
        how: Create,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self
            .export
            .on(at.dir, |dir| self.export.fs.create(who, dir, name, how));
        self.made(at.dir, result, reply)
    }

    fn mkdir(
        &self,
        who: &Caller,
        (at, name): (DirOp, &[u8]),
        set: SetAttr,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self
            .export
            .on(at.dir, |dir| self.export.fs.mkdir(who, dir, name, &set));
        self.made(at.dir, result, reply)
    }

    fn symlink(
        &self,
        who: &Caller,
        (at, name): (DirOp, &[u8]),
        set: SetAttr,
        target: &[u8],
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self.export.on(at.dir, |dir| {
            self.export.fs.symlink(who, dir, name, target, &set)
        });
        self.made(at.dir, result, reply)
    }

    fn mknod(
        &self,
        who: &Caller,
        (at, name): (DirOp, &[u8]),
        node: Node,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let Some((kind, rdev, set)) = node else {
            let after = self.export.attr_after(at.dir);
            put(reply, &nfsstat3::NFS3ERR_BADTYPE)?;
            return put(reply, &wcc_after(after.as_ref(), self.fsid()));
        };
        let result = self.export.on(at.dir, |dir| {
            self.export.fs.mknod(who, dir, name, kind, rdev, &set)
        });
        self.made(at.dir, result, reply)
    }

    fn remove(
        &self,
        who: &Caller,
        (at, name): (DirOp, &[u8]),
        reply: &mut ReplyBuf,
        dir_only: bool,
    ) -> Result<(), Refusal> {
        let result = self.export.on(at.dir, |dir| {
            if dir_only {
                self.export.fs.rmdir(who, dir, name)
            } else {
                self.export.fs.remove(who, dir, name)
            }
        });
        match result {
            Ok(change) => {
                put(reply, &nfsstat3::NFS3_OK)?;
                put(reply, &wcc(&change, self.fsid()))
            }
            Err(e) => self.dir_fail(e, at.dir, reply),
        }
    }

    fn rename(
        &self,
        who: &Caller,
        (from, to): (DirOp, DirOp),
        (from_name, to_name): (&[u8], &[u8]),
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = (|| -> Result<_, Error> {
            let from = self.export.id_of(from.dir)?;
            let to = self.export.id_of(to.dir)?;
            Ok(self.export.fs.rename(who, from, from_name, to, to_name)?)
        })();
        match result {
            Ok((from, to)) => {
                put(reply, &nfsstat3::NFS3_OK)?;
                put(reply, &wcc(&from, self.fsid()))?;
                put(reply, &wcc(&to, self.fsid()))
            }
            Err(e) => {
                let from = self.export.attr_after(from.dir);
                let to = self.export.attr_after(to.dir);
                put(reply, &status(e))?;
                put(reply, &wcc_after(from.as_ref(), self.fsid()))?;
                put(reply, &wcc_after(to.as_ref(), self.fsid()))
            }
        }
    }

    fn link(
        &self,
        who: &Caller,
        file: Checked,
        (at, name): (DirOp, &[u8]),
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = (|| -> Result<_, Error> {
            let id = self.export.id_of(file)?;
            let dir = self.export.id_of(at.dir)?;
            Ok(self.export.fs.link(who, id, dir, name)?)
        })();
        match result {
            Ok((attr, change)) => put(
                reply,
                &LINK3res::Ok(LINK3resok {
                    file_attributes: post_op(Some(&attr), self.fsid()),
                    linkdir_wcc: wcc(&change, self.fsid()),
                }),
            ),
            Err(e) => {
                let file = self.export.attr_after(file);
                let dir = self.export.attr_after(at.dir);
                put(
                    reply,
                    &LINK3res::Err((
                        status(e),
                        LINK3resfail {
                            file_attributes: post_op(file.as_ref(), self.fsid()),
                            linkdir_wcc: wcc_after(dir.as_ref(), self.fsid()),
                        },
                    )),
                )
            }
        }
    }

    fn fsstat(&self, root: Checked, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let result = self
            .export
            .resolve(root)
            .and_then(|(id, attr)| Ok((self.export.fs.fsstat(id)?, attr)));
        let res: FSSTAT3res = match result {
            Ok((s, attr)) => Nfs3Result::Ok(FSSTAT3resok {
                obj_attributes: post_op(Some(&attr), self.fsid()),
                tbytes: s.total_bytes,
                fbytes: s.free_bytes,
                abytes: s.avail_bytes,
                tfiles: s.total_files,
                ffiles: s.free_files,
                afiles: s.avail_files,
                invarsec: 0,
            }),
            Err(e) => Nfs3Result::Err((
                status(e),
                FSSTAT3resfail {
                    obj_attributes: Nfs3Option::None,
                },
            )),
        };
        put(reply, &res)
    }

    fn fsinfo(&self, root: Checked, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let res: FSINFO3res = match self.export.resolve(root) {
            Ok((_, attr)) => Nfs3Result::Ok(FSINFO3resok {
                obj_attributes: post_op(Some(&attr), self.fsid()),
                rtmax: MAX_TRANSFER,
                rtpref: MAX_TRANSFER,
                rtmult: 4096,
                wtmax: MAX_TRANSFER,
                wtpref: MAX_TRANSFER,
                wtmult: 4096,
                dtpref: DIR_PREF,
                maxfilesize: i64::MAX as u64,
                time_delta: nfstime3 {
                    seconds: 0,
                    nseconds: 1,
                },
                properties: PROPERTIES,
            }),
            Err(e) => Nfs3Result::Err((
                status(e),
                FSINFO3resfail {
                    obj_attributes: Nfs3Option::None,
                },
            )),
        };
        put(reply, &res)
    }

    fn pathconf(&self, object: Checked, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let res: PATHCONF3res = match self.export.resolve(object) {
            Ok((_, attr)) => Nfs3Result::Ok(PATHCONF3resok {
                obj_attributes: post_op(Some(&attr), self.fsid()),
                linkmax: 65_000,
                name_max: layerfs_vfs::NAME_MAX as u32,
                no_trunc: true,
                chown_restricted: true,
                case_insensitive: false,
                case_preserving: true,
            }),
            Err(e) => Nfs3Result::Err((
                status(e),
                PATHCONF3resfail {
                    obj_attributes: Nfs3Option::None,
                },
            )),
        };
        put(reply, &res)
    }

    fn commit(&self, file: Checked, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let result = self.export.on(file, |id| self.export.fs.commit(id));
        let res: COMMIT3res = match result {
            Ok(change) => Nfs3Result::Ok(COMMIT3resok {
                file_wcc: wcc(&change, self.fsid()),
                verf: self.write_verf,
            }),
            Err(e) => {
                let after = self
                    .export
                    .resolve(file)
                    .ok()
                    .and_then(|(id, _)| self.attr_of(id));
                Nfs3Result::Err((
                    status(e),
                    COMMIT3resfail {
                        file_wcc: wcc_after(after.as_ref(), self.fsid()),
                    },
                ))
            }
        };
        put(reply, &res)
    }
}

fn read_fail(e: impl Into<Error>, attr: Option<&Attr>, fsid: u64) -> READ3res<'static> {
    Nfs3Result::Err((
        status(e),
        READ3resfail {
            file_attributes: post_op(attr, fsid),
        },
    ))
}

pub(crate) fn put(out: &mut impl std::io::Write, value: &impl Pack) -> Result<(), Refusal> {
    value.pack(out).map(|_| ()).map_err(|_| Refusal::SystemErr)
}

/// How long [`read_header`] is: measured once, as the encoder writes it.
static READ_HEADER_LEN: LazyLock<usize> = LazyLock::new(|| {
    let mut header = Vec::new();
    read_header(&mut header, &Attr::blank(FileKind::Regular), 0, 0, false)
        .expect("packing into memory cannot fail");
    header.len()
});

/// A successful READ's results up to its data: status, attributes, count,
/// eof, and the data's length.
fn read_header(
    out: &mut impl std::io::Write,
    attr: &Attr,
    fsid: u64,
    len: usize,
    eof: bool,
) -> Result<(), Refusal> {
    put(out, &nfsstat3::NFS3_OK)?;
    put(out, &post_op(Some(attr), fsid))?;
    put(out, &(len as u32))?;
    put(out, &eof)?;
    put(out, &(len as u32))
}

impl Program for NfsProgram {
    fn number(&self) -> u32 {
        NFS_PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (NFS_VERSION, NFS_VERSION)
    }

    fn procedure_name(&self, proc: u32) -> Option<&'static str> {
        Proc::from_number(proc).map(Proc::name)
    }

    /// Decodes the arguments once: each handle checked, on the export the
    /// first one names. A procedure that does not exist is PROC_UNAVAIL, and
    /// every check is made for the caller a credential names: a call without
    /// one gets no procedure but NULL.
    fn decode(&self, call: &Call<'_>) -> Decoded {
        let Some(proc) = Proc::from_number(call.proc) else {
            return Decoded::refused(Refusal::ProcUnavail);
        };
        if proc != Proc::Null && matches!(call.cred, Credentials::None) {
            return Decoded::refused(Refusal::AuthTooWeak);
        }
        let mut export = None;
        let mut check = |bytes: &[u8]| -> Checked {
            let export = export.get_or_insert_with(|| self.exports.of_handle(bytes));
            export.as_ref().map_err(|e| *e)?.check(bytes)
        };
        let Some(args) = Args::decode(proc, call.args, &mut check) else {
            return Decoded::refused(Refusal::GarbageArgs);
        };
        let decoded = CallArgs {
            export: export.unwrap_or(Err(Error::BadHandle)),
            args,
        };
        Decoded::new(self.placement(proc, &decoded, call.args), decoded)
    }

    fn call(
        &self,
        call: &Call<'_>,
        args: &DecodedArgs,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let a: &CallArgs = args.downcast_ref().ok_or(Refusal::SystemErr)?;
        let proc = Proc::from_number(call.proc).ok_or(Refusal::ProcUnavail)?;
        let export = match (&a.export, a.args) {
            (_, Args::Null) => return Ok(()),
            // Removed since the call was decoded: its handles are STALE.
            (Ok(export), _) if !self.exports.serves(export) => {
                let stale = Error::Fs(layerfs_vfs::Error::Stale);
                return fail_without_attributes(proc, stale, reply);
            }
            (Ok(export), _) => export,
            (Err(e), _) => return fail_without_attributes(proc, *e, reply),
        };
        let served = Served {
            export,
            write_verf: self.write_verf,
        };
        if !proc.changes() {
            return served.run(call, &a.args, reply);
        }
        let file = a.args.first_file();
        let running = match self.cache.begin(NFS_PROGRAM, call, file) {
            Begun::Replay(results) => {
                tracing::debug!(
                    xid = call.xid,
                    proc = proc.name(),
                    "retransmission answered from the reply cache"
                );
                reply.extend_from_slice(&results);
                return Ok(());
            }
            Begun::InProgress => {
                tracing::debug!(
                    xid = call.xid,
                    proc = proc.name(),
                    "retransmission of a call still running: dropped"
                );
                return Err(Refusal::Dropped);
            }
            Begun::Run(running) => running,
        };
        let start = reply.body_len();
        // Refused or panicking, `running` is dropped and forgets the call.
        served.run(call, &a.args, reply)?;
        if running.finish(reply.body()[start..].to_vec()) {
            reply.call_back_after_sending();
        }
        Ok(())
    }

    /// Hashes a large change's arguments for the reply cache, which the
    /// client did not wait for.
    fn after_reply(&self, call: &Call<'_>, args: &DecodedArgs) {
        if let Some(a) = args.downcast_ref::<CallArgs>() {
            self.cache
                .hash_after_reply(NFS_PROGRAM, call, a.args.first_file());
        }
    }
}
