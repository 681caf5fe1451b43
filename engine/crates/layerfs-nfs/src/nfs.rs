//! NFS version 3 (RFC 1813): the 22 procedures over the exported filesystem.

use std::sync::{Arc, LazyLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::access::granted;
use layerfs_rpc::{xdr, Call, Credentials, FileTail, Placement, Program, Refusal, ReplyBuf};
use layerfs_vfs::{Attr, Caller, Change, Create, FileId, FileKind, Stability};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Pack, Unpack};

use crate::convert::{fattr, from_time, post_op, set_attr, wcc, wcc_after};
use crate::drc::{Begun, ReplyCache};
use crate::error::{status, Error};
use crate::export::{Export, Exports};
use crate::{NFS_PROGRAM, NFS_VERSION};

mod arg_lengths;
mod args;
mod listing;
mod procedures;

use args::WriteArgs;
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

    /// Runs a call on the export its handle names.
    fn run(&self, call: &Call<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let Some(proc) = Proc::from_number(call.proc) else {
            return Err(Refusal::ProcUnavail);
        };
        if proc == Proc::Null {
            return Ok(());
        }
        let walk = arg_lengths::walk(proc.lengths(), call.args);
        if !walk.fits {
            return Err(Refusal::GarbageArgs);
        }
        match self.exports.of_handle(walk.first_handle()) {
            Ok(export) => Served {
                export: &export,
                write_verf: self.write_verf,
            }
            .run(proc, call, reply),
            Err(e) => fail_without_attributes(proc, e, reply),
        }
    }
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

    fn run(&self, proc: Proc, call: &Call<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let who = self.export.caller(call.cred);
        let a = call.args;
        match proc {
            Proc::Null => Ok(()),
            Proc::Getattr => self.getattr(args::handle(a)?, reply),
            Proc::Setattr => self.setattr(&who, args(a)?, reply),
            Proc::Lookup => self.lookup(&who, args::lookup(a)?, reply),
            Proc::Access => self.access(&who, args::access(a)?, reply),
            Proc::Readlink => self.readlink(&who, args::handle(a)?, reply),
            Proc::Read => self.read(&who, args(a)?, reply),
            Proc::Write => self.write(&who, WriteArgs::decode(a)?, reply),
            Proc::Create => self.create(&who, args(a)?, reply),
            Proc::Mkdir => self.mkdir(&who, args(a)?, reply),
            Proc::Symlink => self.symlink(&who, args(a)?, reply),
            Proc::Mknod => self.mknod(&who, args(a)?, reply),
            Proc::Remove => self.remove(&who, args(a)?, reply, false),
            Proc::Rmdir => self.remove(&who, args(a)?, reply, true),
            Proc::Rename => self.rename(&who, args(a)?, reply),
            Proc::Link => self.link(&who, args(a)?, reply),
            Proc::Readdir => self.readdir(&who, args(a)?, reply),
            Proc::Readdirplus => self.readdirplus(&who, args(a)?, reply),
            Proc::Fsstat => self.fsstat(args(a)?, reply),
            Proc::Fsinfo => self.fsinfo(args(a)?, reply),
            Proc::Pathconf => self.pathconf(args(a)?, reply),
            Proc::Commit => self.commit(args(a)?, reply),
        }
    }

    fn getattr(&self, fh: &[u8], reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let res: GETATTR3res = match self.export.resolve(fh) {
            Ok((_, attr)) => Nfs3Result::Ok(GETATTR3resok {
                obj_attributes: fattr(&attr, self.fsid()),
            }),
            Err(e) => Nfs3Result::Err((status(e), nfs3_types::xdr_codec::Void)),
        };
        put(reply, &res)
    }

    fn setattr(&self, who: &Caller, a: SETATTR3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let guard = match a.guard {
            Nfs3Option::Some(ctime) => Some(from_time(ctime)),
            Nfs3Option::None => None,
        };
        let result = self.export.on(&a.object, |id| {
            self.export
                .fs
                .setattr(who, id, &set_attr(&a.new_attributes), guard)
        });
        let res: SETATTR3res = match result {
            Ok(change) => Nfs3Result::Ok(SETATTR3resok {
                obj_wcc: wcc(&change, self.fsid()),
            }),
            Err(e) => {
                let after = self.export.resolve(&a.object).ok().map(|(_, attr)| attr);
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
        (dir, name): (&[u8], &[u8]),
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
        (fh, asked): (&[u8], u32),
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

    fn readlink(&self, who: &Caller, fh: &[u8], reply: &mut ReplyBuf) -> Result<(), Refusal> {
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
    fn read(&self, who: &Caller, a: READ3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let count = a.count.min(MAX_TRANSFER) as usize;
        let resolved = self.export.resolve(&a.file);
        let (id, attr) = match resolved {
            Ok(found) => found,
            Err(e) => return put(reply, &read_fail(e, None, self.fsid())),
        };
        if count >= SEND_FILE_FROM {
            let source = match self.export.fs.host_files() {
                Some(files) => files.read_source(who, id, a.offset, count),
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
        let read = reply.append_with(|body| self.export.fs.read(who, id, a.offset, count, body));
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

    fn write(&self, who: &Caller, a: WriteArgs<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let data = a.data;
        let result = self.export.on(a.file, |id| {
            self.export.fs.write(who, id, a.offset, data, a.stable)
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
                let after = self.export.resolve(a.file).ok().map(|(_, attr)| attr);
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
        dir: &nfs_fh3,
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
    fn dir_fail(&self, e: Error, dir: &nfs_fh3, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let after = self.export.resolve(dir).ok().map(|(_, attr)| attr);
        put(reply, &status(e))?;
        put(reply, &wcc_after(after.as_ref(), self.fsid()))
    }

    fn create(
        &self,
        who: &Caller,
        a: CREATE3args<'static>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let how = match &a.how {
            createhow3::UNCHECKED(s) => Create::Unchecked(set_attr(s)),
            createhow3::GUARDED(s) => Create::Guarded(set_attr(s)),
            createhow3::EXCLUSIVE(v) => Create::Exclusive(v.0),
        };
        let result = self.export.on(&a.where_.dir, |dir| {
            self.export.fs.create(who, dir, a.where_.name.as_ref(), how)
        });
        self.made(&a.where_.dir, result, reply)
    }

    fn mkdir(
        &self,
        who: &Caller,
        a: MKDIR3args<'static>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self.export.on(&a.where_.dir, |dir| {
            self.export
                .fs
                .mkdir(who, dir, a.where_.name.as_ref(), &set_attr(&a.attributes))
        });
        self.made(&a.where_.dir, result, reply)
    }

    fn symlink(
        &self,
        who: &Caller,
        a: SYMLINK3args<'static>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self.export.on(&a.where_.dir, |dir| {
            let set = set_attr(&a.symlink.symlink_attributes);
            self.export.fs.symlink(
                who,
                dir,
                a.where_.name.as_ref(),
                a.symlink.symlink_data.as_ref(),
                &set,
            )
        });
        self.made(&a.where_.dir, result, reply)
    }

    fn mknod(
        &self,
        who: &Caller,
        a: MKNOD3args<'static>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let (kind, rdev, set) = match &a.what {
            mknoddata3::NF3CHR(d) => (
                FileKind::CharDevice,
                (d.spec.specdata1, d.spec.specdata2),
                set_attr(&d.dev_attributes),
            ),
            mknoddata3::NF3BLK(d) => (
                FileKind::BlockDevice,
                (d.spec.specdata1, d.spec.specdata2),
                set_attr(&d.dev_attributes),
            ),
            mknoddata3::NF3SOCK(s) => (FileKind::Socket, (0, 0), set_attr(s)),
            mknoddata3::NF3FIFO(s) => (FileKind::Fifo, (0, 0), set_attr(s)),
            mknoddata3::default => {
                let after = self
                    .export
                    .resolve(&a.where_.dir)
                    .ok()
                    .map(|(_, attr)| attr);
                put(reply, &nfsstat3::NFS3ERR_BADTYPE)?;
                return put(reply, &wcc_after(after.as_ref(), self.fsid()));
            }
        };
        let result = self.export.on(&a.where_.dir, |dir| {
            self.export
                .fs
                .mknod(who, dir, a.where_.name.as_ref(), kind, rdev, &set)
        });
        self.made(&a.where_.dir, result, reply)
    }

    fn remove(
        &self,
        who: &Caller,
        a: REMOVE3args<'static>,
        reply: &mut ReplyBuf,
        dir_only: bool,
    ) -> Result<(), Refusal> {
        let result = self.export.on(&a.object.dir, |dir| {
            let name = a.object.name.as_ref();
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
            Err(e) => self.dir_fail(e, &a.object.dir, reply),
        }
    }

    fn rename(
        &self,
        who: &Caller,
        a: RENAME3args<'static, 'static>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = (|| -> Result<_, Error> {
            let from = self.export.id_of(&a.from.dir)?;
            let to = self.export.id_of(&a.to.dir)?;
            Ok(self
                .export
                .fs
                .rename(who, from, a.from.name.as_ref(), to, a.to.name.as_ref())?)
        })();
        match result {
            Ok((from, to)) => {
                put(reply, &nfsstat3::NFS3_OK)?;
                put(reply, &wcc(&from, self.fsid()))?;
                put(reply, &wcc(&to, self.fsid()))
            }
            Err(e) => {
                let from = self.export.resolve(&a.from.dir).ok().map(|(_, attr)| attr);
                let to = self.export.resolve(&a.to.dir).ok().map(|(_, attr)| attr);
                put(reply, &status(e))?;
                put(reply, &wcc_after(from.as_ref(), self.fsid()))?;
                put(reply, &wcc_after(to.as_ref(), self.fsid()))
            }
        }
    }

    fn link(
        &self,
        who: &Caller,
        a: LINK3args<'static>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = (|| -> Result<_, Error> {
            let id = self.export.id_of(&a.file)?;
            let dir = self.export.id_of(&a.link.dir)?;
            Ok(self.export.fs.link(who, id, dir, a.link.name.as_ref())?)
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
                let file = self.export.resolve(&a.file).ok().map(|(_, attr)| attr);
                let dir = self.export.resolve(&a.link.dir).ok().map(|(_, attr)| attr);
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

    fn fsstat(&self, a: FSSTAT3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let result = self
            .export
            .resolve(&a.fsroot)
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

    fn fsinfo(&self, a: FSINFO3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let res: FSINFO3res = match self.export.resolve(&a.fsroot) {
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

    fn pathconf(&self, a: PATHCONF3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let res: PATHCONF3res = match self.export.resolve(&a.object) {
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

    fn commit(&self, a: COMMIT3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let result = self.export.on(&a.file, |id| self.export.fs.commit(id));
        let res: COMMIT3res = match result {
            Ok(change) => Nfs3Result::Ok(COMMIT3resok {
                file_wcc: wcc(&change, self.fsid()),
                verf: self.write_verf,
            }),
            Err(e) => {
                let after = self
                    .export
                    .resolve(&a.file)
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

/// Procedures that change something: their retransmissions are answered
/// from the reply cache.
fn args<T: Unpack>(mut bytes: &[u8]) -> Result<T, Refusal> {
    T::unpack(&mut bytes)
        .map(|(v, _)| v)
        .map_err(|_| Refusal::GarbageArgs)
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

    /// What the procedure table says, where the filesystem finds every
    /// handle's file without walking the tree for it and copies nothing up;
    /// a SETATTR that sets a size only when the connection is idle (a
    /// truncation frees pages in time that grows with the file); a WRITE
    /// only when it asks for no fsync; a listing only
    /// when the filesystem has it at hand (a directory listed lately: no
    /// host call per entry, where a cold one could read thousands of
    /// inodes from disk).
    fn placement(&self, call: &Call<'_>) -> Placement {
        let Some(p) = Proc::from_number(call.proc) else {
            return Placement::Worker;
        };
        let walk = arg_lengths::walk(p.lengths(), call.args);
        if !walk.fits {
            // Answered GARBAGE_ARGS at once.
            return Placement::Reader;
        }
        let runs = match p {
            Proc::Setattr if walk.sets_size => Placement::ReaderWhenIdle,
            _ => p.runs(),
        };
        if runs == Placement::Worker || (p == Proc::Write && !args::is_unstable(walk.rest)) {
            return Placement::Worker;
        }
        let lists = match p {
            Proc::Readdir => Some(false),
            Proc::Readdirplus => Some(true),
            _ => None,
        };
        let at_hand = walk.handles().all(|h| {
            self.exports.is_at_hand(h.handle, h.entry, p.copies_up())
                && lists.is_none_or(|with_attrs| self.exports.lists_at_hand(h.handle, with_attrs))
        });
        if at_hand {
            runs
        } else {
            Placement::Worker
        }
    }

    fn call(&self, call: &Call<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        // Every check is made for the caller a credential names: a call
        // without one gets no procedure but NULL.
        if call.proc != Proc::Null as u32 && matches!(call.cred, Credentials::None) {
            return Err(Refusal::AuthTooWeak);
        }
        let Some(proc) = Proc::from_number(call.proc).filter(|p| p.changes()) else {
            return self.run(call, reply);
        };
        let running = match self.cache.begin(NFS_PROGRAM, call) {
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
        self.run(call, reply)?;
        if running.finish(reply.body()[start..].to_vec()) {
            reply.call_back_after_sending();
        }
        Ok(())
    }

    /// Hashes a large change's arguments for the reply cache, which the
    /// client did not wait for.
    fn after_reply(&self, call: &Call<'_>) {
        self.cache.hash_after_reply(NFS_PROGRAM, call);
    }
}
