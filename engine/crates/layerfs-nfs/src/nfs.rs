//! NFS version 3 (RFC 1813): the 22 procedures over the exported filesystem.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use layerfs_rpc::{Call, Program, Refusal, ReplyBuf};
use layerfs_vfs::access::granted;
use layerfs_vfs::{Attr, Caller, Change, Create, Error, FileId, FileKind, Stability};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{List, Opaque, Pack, Unpack};

use crate::convert::{fattr, from_time, post_op, set_attr, status, wcc, wcc_after};
use crate::drc::{Key, ReplyCache};
use crate::export::{caller, Export};
use crate::{NFS_PROGRAM, NFS_VERSION};

const PROCEDURES: [&str; 22] = [
    "NULL",
    "GETATTR",
    "SETATTR",
    "LOOKUP",
    "ACCESS",
    "READLINK",
    "READ",
    "WRITE",
    "CREATE",
    "MKDIR",
    "SYMLINK",
    "MKNOD",
    "REMOVE",
    "RMDIR",
    "RENAME",
    "LINK",
    "READDIR",
    "READDIRPLUS",
    "FSSTAT",
    "FSINFO",
    "PATHCONF",
    "COMMIT",
];

/// Largest READ and WRITE; the Linux client uses it as rsize and wsize.
pub const MAX_TRANSFER: u32 = 1024 * 1024;
/// Preferred READDIR size.
const DIR_PREF: u32 = 64 * 1024;
/// FSINFO properties: LINK, SYMLINK, HOMOGENEOUS, CANSETTIME.
const PROPERTIES: u32 = 0x0001 | 0x0002 | 0x0008 | 0x0010;
const REPLY_CACHE_ENTRIES: usize = 4096;

/// NFS version 3 over one export.
pub struct NfsProgram {
    export: Arc<Export>,
    /// One per server instance, the same in WRITE and COMMIT: a new one after
    /// a restart tells clients to resend what they wrote unstably.
    write_verf: writeverf3,
    cache: ReplyCache,
}

impl NfsProgram {
    pub fn new(export: Arc<Export>) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let verf = (now.as_nanos() as u64) ^ (u64::from(std::process::id()) << 48);
        NfsProgram {
            export,
            write_verf: writeverf3(verf.to_be_bytes()),
            cache: ReplyCache::new(REPLY_CACHE_ENTRIES),
        }
    }

    fn fsid(&self) -> u64 {
        self.export.id
    }

    fn attr_of(&self, id: FileId) -> Option<Attr> {
        self.export.fs.getattr(id).ok()
    }

    fn run(&self, call: &Call<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let who = caller(call.cred);
        let a = call.args;
        match call.proc {
            0 => Ok(()),
            1 => self.getattr(args(a)?, reply),
            2 => self.setattr(&who, args(a)?, reply),
            3 => self.lookup(&who, args(a)?, reply),
            4 => self.access(&who, args(a)?, reply),
            5 => self.readlink(&who, args(a)?, reply),
            6 => self.read(&who, args(a)?, reply),
            7 => self.write(&who, WriteArgs::decode(a)?, reply),
            8 => self.create(&who, args(a)?, reply),
            9 => self.mkdir(&who, args(a)?, reply),
            10 => self.symlink(&who, args(a)?, reply),
            11 => self.mknod(&who, args(a)?, reply),
            12 => self.remove(&who, args(a)?, reply, false),
            13 => self.remove(&who, args(a)?, reply, true),
            14 => self.rename(&who, args(a)?, reply),
            15 => self.link(&who, args(a)?, reply),
            16 => self.readdir(&who, args(a)?, reply),
            17 => self.readdirplus(&who, args(a)?, reply),
            18 => self.fsstat(args(a)?, reply),
            19 => self.fsinfo(args(a)?, reply),
            20 => self.pathconf(args(a)?, reply),
            21 => self.commit(args(a)?, reply),
            _ => Err(Refusal::ProcUnavail),
        }
    }

    fn getattr(&self, a: GETATTR3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let res: GETATTR3res = match self.export.resolve(&a.object) {
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
        let result = self.export.resolve(&a.object).and_then(|(id, _)| {
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
        a: LOOKUP3args<'static>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let found = self
            .export
            .resolve(&a.what.dir)
            .and_then(|(dir, dir_attr)| {
                let attr = self.export.fs.lookup(who, dir, a.what.name.as_ref())?;
                Ok((attr, dir_attr))
            });
        let res: LOOKUP3res = match found {
            Ok((attr, dir_attr)) => Nfs3Result::Ok(LOOKUP3resok {
                object: self.export.handle(&attr),
                obj_attributes: post_op(Some(&attr), self.fsid()),
                dir_attributes: post_op(Some(&dir_attr), self.fsid()),
            }),
            Err(e) => {
                let dir_attr = self.export.resolve(&a.what.dir).ok().map(|(_, attr)| attr);
                Nfs3Result::Err((
                    status(e),
                    LOOKUP3resfail {
                        dir_attributes: post_op(dir_attr.as_ref(), self.fsid()),
                    },
                ))
            }
        };
        put(reply, &res)
    }

    fn access(&self, who: &Caller, a: ACCESS3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let res: ACCESS3res = match self.export.resolve(&a.object) {
            Ok((_, attr)) => Nfs3Result::Ok(ACCESS3resok {
                obj_attributes: post_op(Some(&attr), self.fsid()),
                access: granted(&attr, who, a.access),
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

    fn readlink(
        &self,
        who: &Caller,
        a: READLINK3args,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self.export.resolve(&a.symlink).and_then(|(id, attr)| {
            self.export
                .fs
                .readlink(who, id)
                .map(|target| (target, attr))
        });
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

    /// READ reads the file straight into the reply: the header is reserved
    /// first and filled in once the data's length and the attributes are known.
    fn read(&self, who: &Caller, a: READ3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let count = a.count.min(MAX_TRANSFER) as usize;
        let resolved = self.export.resolve(&a.file);
        let (id, attr) = match resolved {
            Ok(found) => found,
            Err(e) => return put(reply, &read_fail(e, None, self.fsid())),
        };
        // status, post_op_attr (present), count, eof, data length.
        const HEADER: usize = 4 + 4 + 84 + 4 + 4 + 4;
        let header_at = reply.body_len();
        reply.reserve(HEADER + count + 4);
        reply.extend_from_slice(&[0; HEADER]);
        let data_at = reply.as_mut_vec().len();
        match self
            .export
            .fs
            .read(who, id, a.offset, count, reply.as_mut_vec())
        {
            Ok((eof, attr)) => {
                let n = reply.as_mut_vec().len() - data_at;
                reply.extend_from_slice(&[0; 3][..(4 - n % 4) % 4]);
                let mut header = Vec::with_capacity(HEADER);
                put_into(&mut header, &nfsstat3::NFS3_OK)?;
                put_into(&mut header, &post_op(Some(&attr), self.fsid()))?;
                put_into(&mut header, &(n as u32))?;
                put_into(&mut header, &eof)?;
                put_into(&mut header, &(n as u32))?;
                debug_assert_eq!(header.len(), HEADER);
                reply.patch_body(header_at, &header);
                Ok(())
            }
            Err(e) => {
                reply.as_mut_vec().truncate(4 + header_at);
                put(reply, &read_fail(e, Some(&attr), self.fsid()))
            }
        }
    }

    fn write(&self, who: &Caller, a: WriteArgs<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let data = a.data;
        let result = self
            .export
            .resolve(&a.file)
            .and_then(|(id, _)| self.export.fs.write(who, id, a.offset, data, a.stable));
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
                let after = self.export.resolve(&a.file).ok().map(|(_, attr)| attr);
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
        let result = self
            .export
            .resolve(&a.where_.dir)
            .and_then(|(dir, _)| self.export.fs.create(who, dir, a.where_.name.as_ref(), how));
        self.made(&a.where_.dir, result, reply)
    }

    fn mkdir(
        &self,
        who: &Caller,
        a: MKDIR3args<'static>,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let result = self.export.resolve(&a.where_.dir).and_then(|(dir, _)| {
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
        let result = self.export.resolve(&a.where_.dir).and_then(|(dir, _)| {
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
        let result = self.export.resolve(&a.where_.dir).and_then(|(dir, _)| {
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
        let result = self.export.resolve(&a.object.dir).and_then(|(dir, _)| {
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
        let result = self.export.resolve(&a.from.dir).and_then(|(from, _)| {
            let (to, _) = self.export.resolve(&a.to.dir)?;
            self.export
                .fs
                .rename(who, from, a.from.name.as_ref(), to, a.to.name.as_ref())
        });
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
        let result = self.export.resolve(&a.file).and_then(|(id, _)| {
            let (dir, _) = self.export.resolve(&a.link.dir)?;
            self.export.fs.link(who, id, dir, a.link.name.as_ref())
        });
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

    /// The start of a READDIR(PLUS) that passed its checks: the directory's
    /// id, attributes and cookie verifier.
    fn open_listing(
        &self,
        dir: &nfs_fh3,
        cookie: u64,
        verf: &cookieverf3,
    ) -> Result<(FileId, Attr, cookieverf3), (Error, Option<Attr>)> {
        let (id, attr) = self.export.resolve(dir).map_err(|e| (e, None))?;
        if attr.kind != FileKind::Directory {
            return Err((Error::NotDir, Some(attr)));
        }
        // Stable per directory and across restarts: cookies are name
        // hashes, valid as long as the directory is the same one.
        let ours = cookieverf3((attr.fileid ^ attr.generation).to_be_bytes());
        if cookie != 0 && verf.0 != [0; 8] && *verf != ours {
            return Err((Error::BadCookie, Some(attr)));
        }
        Ok((id, attr, ours))
    }

    fn readdir(&self, who: &Caller, a: READDIR3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let (dir, attr, verf) = match self.open_listing(&a.dir, a.cookie, &a.cookieverf) {
            Ok(found) => found,
            Err((e, attr)) => {
                return put(
                    reply,
                    &READDIR3res::Err((
                        status(e),
                        READDIR3resfail {
                            dir_attributes: post_op(attr.as_ref(), self.fsid()),
                        },
                    )),
                )
            }
        };
        // status, dir attributes, verifier, end of list, eof.
        let mut size = 4 + 88 + 8 + 4 + 4;
        let budget = a.count as usize;
        let page = match self
            .export
            .fs
            .readdir(who, dir, a.cookie, budget / 20 + 2, false)
        {
            Ok(page) => page,
            Err(e) => {
                return put(
                    reply,
                    &READDIR3res::Err((
                        status(e),
                        READDIR3resfail {
                            dir_attributes: post_op(Some(&attr), self.fsid()),
                        },
                    )),
                )
            }
        };
        let total = page.entries.len();
        let mut entries = Vec::new();
        for e in &page.entries {
            let entry_size = 4 + 8 + 4 + padded(e.name.len()) + 8;
            if size + entry_size > budget {
                break;
            }
            size += entry_size;
            entries.push(entry3 {
                fileid: e.fileid,
                name: filename3(Opaque::borrowed(&e.name)),
                cookie: e.cookie,
            });
        }
        if entries.is_empty() && total > 0 {
            return put(
                reply,
                &READDIR3res::Err((
                    nfsstat3::NFS3ERR_TOOSMALL,
                    READDIR3resfail {
                        dir_attributes: post_op(Some(&attr), self.fsid()),
                    },
                )),
            );
        }
        let eof = page.eof && entries.len() == total;
        reply.reserve(size);
        put(
            reply,
            &READDIR3res::Ok(READDIR3resok {
                dir_attributes: post_op(Some(&attr), self.fsid()),
                cookieverf: verf,
                reply: dirlist3 {
                    entries: List(entries),
                    eof,
                },
            }),
        )
    }

    fn readdirplus(
        &self,
        who: &Caller,
        a: READDIRPLUS3args,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let fail = |e: Error, attr: Option<&Attr>, reply: &mut ReplyBuf| {
            put(
                reply,
                &READDIRPLUS3res::Err((
                    status(e),
                    READDIRPLUS3resfail {
                        dir_attributes: post_op(attr, self.fsid()),
                    },
                )),
            )
        };
        let (dir, attr, verf) = match self.open_listing(&a.dir, a.cookie, &a.cookieverf) {
            Ok(found) => found,
            Err((e, attr)) => return fail(e, attr.as_ref(), reply),
        };
        let budget = a.maxcount as usize;
        let dir_budget = a.dircount as usize;
        let mut size = 4 + 88 + 8 + 4 + 4;
        let mut dir_size = 0;
        // Entries are at least 140 bytes of the reply and 24 of the directory
        // information: ask the filesystem (and its stat calls) for no more.
        let most = (budget / 140).min(if dir_budget > 0 {
            dir_budget / 24
        } else {
            usize::MAX
        }) + 2;
        let page = match self.export.fs.readdir(who, dir, a.cookie, most, true) {
            Ok(page) => page,
            Err(e) => return fail(e, Some(&attr), reply),
        };
        // Count what fits, then encode it straight into the reply: no
        // per-entry buffers for a listing of thousands.
        let mut fit = 0;
        for e in &page.entries {
            let name_size = 8 + 4 + padded(e.name.len()) + 8;
            let entry_size = 4 + name_size + 88 + 4 + 4 + padded(crate::handle::LEN);
            if size + entry_size > budget
                || (dir_budget > 0 && dir_size + name_size > dir_budget && fit > 0)
            {
                break;
            }
            size += entry_size;
            dir_size += name_size;
            fit += 1;
        }
        if fit == 0 && !page.entries.is_empty() {
            return fail(Error::TooSmall, Some(&attr), reply);
        }
        let eof = page.eof && fit == page.entries.len();
        reply.reserve(size);
        put(reply, &nfsstat3::NFS3_OK)?;
        put(reply, &post_op(Some(&attr), self.fsid()))?;
        put(reply, &verf)?;
        for e in &page.entries[..fit] {
            put(reply, &true)?;
            put(reply, &e.fileid)?;
            put(reply, &filename3(Opaque::borrowed(&e.name)))?;
            put(reply, &e.cookie)?;
            put(reply, &post_op(e.attr.as_ref(), self.fsid()))?;
            match &e.attr {
                Some(attr) => {
                    put(reply, &true)?;
                    put(reply, &Opaque::borrowed(&self.export.handle_bytes(attr)))?;
                }
                None => put(reply, &false)?,
            }
        }
        put(reply, &false)?;
        put(reply, &eof)
    }

    fn fsstat(&self, a: FSSTAT3args, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let result = self
            .export
            .resolve(&a.fsroot)
            .and_then(|(id, attr)| self.export.fs.fsstat(id).map(|s| (s, attr)));
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
        let result = self
            .export
            .resolve(&a.file)
            .and_then(|(id, _)| self.export.fs.commit(id));
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

/// WRITE3args with the data borrowed from the record: `nfs3_types` would copy
/// the payload (up to 1 MiB) into a buffer of its own first.
struct WriteArgs<'a> {
    file: nfs_fh3,
    offset: u64,
    stable: Stability,
    data: &'a [u8],
}

impl<'a> WriteArgs<'a> {
    fn decode(mut args: &'a [u8]) -> Result<WriteArgs<'a>, Refusal> {
        fn take<'b>(r: &mut &'b [u8], n: usize) -> Result<&'b [u8], Refusal> {
            let (head, rest) = r.split_at_checked(n).ok_or(Refusal::GarbageArgs)?;
            *r = rest;
            Ok(head)
        }
        fn word(r: &mut &[u8]) -> Result<u32, Refusal> {
            Ok(u32::from_be_bytes(take(r, 4)?.try_into().expect("4 bytes")))
        }
        let r = &mut args;
        let fh_len = word(r)? as usize;
        if fh_len > NFS3_FHSIZE {
            return Err(Refusal::GarbageArgs);
        }
        let fh = take(r, fh_len.div_ceil(4) * 4)?[..fh_len].to_vec();
        let offset = (u64::from(word(r)?) << 32) | u64::from(word(r)?);
        let count = word(r)? as usize;
        let stable = match word(r)? {
            0 => Stability::Unstable,
            1 => Stability::DataSync,
            2 => Stability::FileSync,
            _ => return Err(Refusal::GarbageArgs),
        };
        let len = word(r)? as usize;
        let data = take(r, len)?;
        Ok(WriteArgs {
            file: nfs_fh3 {
                data: Opaque::owned(fh),
            },
            offset,
            stable,
            data: &data[..count.min(len)],
        })
    }
}

fn read_fail(e: Error, attr: Option<&Attr>, fsid: u64) -> READ3res<'static> {
    Nfs3Result::Err((
        status(e),
        READ3resfail {
            file_attributes: post_op(attr, fsid),
        },
    ))
}

fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

/// Procedures that change something: their retransmissions are answered
/// from the reply cache.
fn is_non_idempotent(proc: u32) -> bool {
    matches!(proc, 2 | 7..=15)
}

fn args<T: Unpack>(mut bytes: &[u8]) -> Result<T, Refusal> {
    T::unpack(&mut bytes)
        .map(|(v, _)| v)
        .map_err(|_| Refusal::GarbageArgs)
}

fn put(reply: &mut ReplyBuf, value: &impl Pack) -> Result<(), Refusal> {
    value
        .pack(reply)
        .map(|_| ())
        .map_err(|_| Refusal::SystemErr)
}

fn put_into(out: &mut Vec<u8>, value: &impl Pack) -> Result<(), Refusal> {
    value.pack(out).map(|_| ()).map_err(|_| Refusal::SystemErr)
}

impl Program for NfsProgram {
    fn number(&self) -> u32 {
        NFS_PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (NFS_VERSION, NFS_VERSION)
    }

    fn procedure_name(&self, proc: u32) -> Option<&'static str> {
        PROCEDURES.get(proc as usize).copied()
    }

    /// Metadata reads that the host answers from its caches in microseconds.
    fn is_quick(&self, proc: u32) -> bool {
        matches!(proc, 0 | 1 | 3 | 4 | 5 | 19 | 20)
    }

    fn call(&self, call: &Call<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        if !is_non_idempotent(call.proc) {
            return self.run(call, reply);
        }
        let key = Key::of(NFS_PROGRAM, call);
        if let Some(results) = self.cache.begin(&key) {
            tracing::debug!(
                xid = call.xid,
                proc = PROCEDURES[call.proc as usize],
                "retransmission answered from the reply cache"
            );
            reply.extend_from_slice(&results);
            return Ok(());
        }
        let start = reply.body_len();
        match self.run(call, reply) {
            Ok(()) => {
                self.cache.finish(key, reply.body()[start..].to_vec());
                Ok(())
            }
            Err(refusal) => {
                self.cache.abandon(key);
                Err(refusal)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(args: &WRITE3args<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        args.pack(&mut out).unwrap();
        out
    }

    fn sample(data: &[u8]) -> WRITE3args<'_> {
        WRITE3args {
            file: nfs_fh3 {
                data: Opaque::owned(vec![7; 25]),
            },
            offset: 0x1_0000_0002,
            count: data.len() as u32,
            stable: stable_how::DATA_SYNC,
            data: Opaque::borrowed(data),
        }
    }

    #[test]
    fn write_args_borrow_the_payload() {
        let bytes = packed(&sample(b"payload!x"));
        let a = WriteArgs::decode(&bytes).unwrap();
        assert_eq!(a.file.data.as_ref(), &[7; 25]);
        assert_eq!((a.offset, a.stable), (0x1_0000_0002, Stability::DataSync));
        assert_eq!(a.data, b"payload!x");
        let at = bytes.len() - 12;
        assert!(
            std::ptr::eq(a.data.as_ptr(), bytes[at..].as_ptr()),
            "not copied"
        );
    }

    #[test]
    fn malformed_write_args_are_garbage() {
        let good = packed(&sample(b"data"));
        for cut in [0, 3, 20, good.len() - 5] {
            assert!(WriteArgs::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long_fh = good.clone();
        long_fh[..4].copy_from_slice(&65u32.to_be_bytes());
        assert!(WriteArgs::decode(&long_fh).is_err());
        let mut huge = good.clone();
        let len_at = good.len() - 8;
        huge[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(
            WriteArgs::decode(&huge).is_err(),
            "a length past the record"
        );
        let mut bad_stable = good;
        let stable_at = len_at - 4;
        bad_stable[stable_at..stable_at + 4].copy_from_slice(&3u32.to_be_bytes());
        assert!(WriteArgs::decode(&bad_stable).is_err());
    }
}
