//! READDIR and READDIRPLUS: pages of a directory within the client's byte budgets.

use layerfs_rpc::{Refusal, ReplyBuf};
use layerfs_vfs::{Attr, Caller, FileId, FileKind};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{List, Opaque};

use layerfs_rpc::xdr::padded;

use super::{put, Served};
use crate::convert::post_op;
use crate::error::{status, Error};

impl Served<'_> {
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
            return Err((Error::Fs(layerfs_vfs::Error::NotDir), Some(attr)));
        }
        // Stable per directory and across restarts: cookies are name
        // hashes, valid as long as the directory is the same one.
        let ours = cookieverf3((attr.fileid ^ attr.generation).to_be_bytes());
        if cookie != 0 && verf.0 != [0; 8] && *verf != ours {
            return Err((Error::BadCookie, Some(attr)));
        }
        Ok((id, attr, ours))
    }

    pub(super) fn readdir(
        &self,
        who: &Caller,
        a: READDIR3args,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
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

    pub(super) fn readdirplus(
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
            Err(e) => return fail(e.into(), Some(&attr), reply),
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
        let mut sign = self.export.listing_signer();
        for e in &page.entries[..fit] {
            put(reply, &true)?;
            put(reply, &e.fileid)?;
            put(reply, &filename3(Opaque::borrowed(&e.name)))?;
            put(reply, &e.cookie)?;
            put(reply, &post_op(e.attr.as_ref(), self.fsid()))?;
            match &e.attr {
                Some(attr) => {
                    put(reply, &true)?;
                    put(reply, &Opaque::borrowed(&sign(attr)))?;
                }
                None => put(reply, &false)?,
            }
        }
        put(reply, &false)?;
        put(reply, &eof)
    }
}
