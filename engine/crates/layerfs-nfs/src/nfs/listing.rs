//! READDIR and READDIRPLUS: pages of a directory within the client's byte budgets.

use layerfs_rpc::{Refusal, ReplyBuf};
use layerfs_vfs::{Attr, Caller, DirEntry, DirPage};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{List, Opaque};

use layerfs_rpc::xdr::padded;

use super::{put, Served};
use crate::convert::post_op;
use crate::error::{status, Error};

impl Served<'_> {
    /// A page of the directory a handle names, after `cookie`, at most
    /// `max` entries, and the cookie verifier; on failure, the directory's
    /// attributes if the handle still names it.
    fn page(
        &self,
        who: &Caller,
        dir: &nfs_fh3,
        (cookie, verf): (u64, &cookieverf3),
        max: usize,
        with_attrs: bool,
    ) -> Result<(DirPage, cookieverf3), (Error, Option<Attr>)> {
        let fs = &self.export.fs;
        let (page, attr) = self.export.on_read(dir, |id| {
            let page = fs.readdir(who, id, cookie, max, with_attrs)?;
            let attr = page.dir;
            Ok((page, attr))
        })?;
        // Stable per directory and across restarts: cookies are name
        // hashes, valid as long as the directory is the same one.
        let ours = cookieverf3((attr.fileid ^ attr.generation).to_be_bytes());
        if cookie != 0 && verf.0 != [0; 8] && *verf != ours {
            return Err((Error::BadCookie, Some(attr)));
        }
        Ok((page, ours))
    }

    pub(super) fn readdir(
        &self,
        who: &Caller,
        a: READDIR3args,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        // status, dir attributes, verifier, end of list, eof.
        let mut size = 4 + 88 + 8 + 4 + 4;
        let budget = a.count as usize;
        let at = (a.cookie, &a.cookieverf);
        let (page, verf) = match self.page(who, &a.dir, at, budget / 20 + 2, false) {
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
        let attr = page.dir;
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
        let at = (a.cookie, &a.cookieverf);
        let (page, verf) = match self.page(who, &a.dir, at, most, true) {
            Ok(found) => found,
            Err((e, attr)) => return fail(e, attr.as_ref(), reply),
        };
        let attr = page.dir;
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
        let mut packed = PackedEntry::default();
        for e in &page.entries[..fit] {
            let handle = e.attr.as_ref().map(&mut sign);
            packed.pack(e, self.fsid(), handle.as_ref());
            reply.extend_from_slice(packed.bytes());
        }
        put(reply, &false)?;
        put(reply, &eof)
    }
}

/// The longest `entryplus3`: marker, fileid, name (255 bytes, padded),
/// cookie, attributes, handle.
const ENTRY_MAX: usize = 4 + 8 + 4 + 256 + 8 + 4 + 84 + 4 + 4 + padded(crate::handle::LEN);

/// One READDIRPLUS entry packed as XDR's `entryplus3` with the list marker
/// before it, as nfs3_types packs it field by field: a listing of thousands
/// then costs one copy into the reply per entry.
struct PackedEntry {
    buf: [u8; ENTRY_MAX],
    len: usize,
}

impl Default for PackedEntry {
    fn default() -> Self {
        PackedEntry {
            buf: [0; ENTRY_MAX],
            len: 0,
        }
    }
}

impl PackedEntry {
    fn pack(&mut self, e: &DirEntry, fsid: u64, handle: Option<&[u8; crate::handle::LEN]>) {
        self.len = 0;
        self.u32(1);
        self.u64(e.fileid);
        self.opaque(&e.name);
        self.u64(e.cookie);
        // The attributes are packed as `post_op` converts them, one rule.
        match &e.attr {
            Some(attr) => {
                let a = crate::convert::fattr(attr, fsid);
                self.u32(1);
                for word in [a.type_ as u32, a.mode, a.nlink, a.uid, a.gid] {
                    self.u32(word);
                }
                self.u64(a.size);
                self.u64(a.used);
                self.u32(a.rdev.specdata1);
                self.u32(a.rdev.specdata2);
                self.u64(a.fsid);
                self.u64(a.fileid);
                for t in [a.atime, a.mtime, a.ctime] {
                    self.u32(t.seconds);
                    self.u32(t.nseconds);
                }
            }
            None => self.u32(0),
        }
        match handle {
            Some(handle) => {
                self.u32(1);
                self.opaque(handle);
            }
            None => self.u32(0),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn u32(&mut self, v: u32) {
        self.put(&v.to_be_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.put(&v.to_be_bytes());
    }

    /// Length, bytes, zeros to the next four-byte boundary.
    fn opaque(&mut self, bytes: &[u8]) {
        self.u32(bytes.len() as u32);
        self.put(bytes);
        let pad = padded(bytes.len()) - bytes.len();
        self.put(&[0; 3][..pad]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerfs_vfs::{FileKind, Timestamp};
    use nfs3_types::xdr_codec::Pack;

    /// What nfs3_types packs for the same entry.
    fn by_nfs3_types<'a>(
        e: &'a DirEntry,
        fsid: u64,
        handle: Option<&'a [u8; crate::handle::LEN]>,
    ) -> Vec<u8> {
        let entry = entryplus3 {
            fileid: e.fileid,
            name: filename3(Opaque::borrowed(&e.name)),
            cookie: e.cookie,
            name_attributes: post_op(e.attr.as_ref(), fsid),
            name_handle: match handle {
                Some(h) => Nfs3Option::Some(nfs_fh3 {
                    data: Opaque::owned(h.to_vec()),
                }),
                None => Nfs3Option::None,
            },
        };
        let mut out = Vec::new();
        true.pack(&mut out).unwrap();
        entry.pack(&mut out).unwrap();
        out
    }

    #[test]
    fn an_entry_packs_as_nfs3_types_packs_it() {
        let attr = Attr {
            kind: FileKind::Symlink,
            mode: 0o4755,
            nlink: 3,
            uid: 1000,
            gid: u32::MAX,
            size: u64::MAX - 1,
            used: 1 << 40,
            rdev: (8, 1),
            fileid: 0x0102_0304_0506_0708,
            generation: 9,
            // Before the epoch, within range, past 2106: clamped alike.
            atime: Timestamp { secs: -5, nanos: 7 },
            mtime: Timestamp {
                secs: 1_700_000_000,
                nanos: 999_999_999,
            },
            ctime: Timestamp {
                secs: 1 << 40,
                nanos: 1,
            },
        };
        let handle: [u8; crate::handle::LEN] = std::array::from_fn(|i| i as u8);
        let mut packed = PackedEntry::default();
        for len in [1, 2, 3, 4, 5, 7, 8, 254, 255] {
            for with_attr in [true, false] {
                for with_handle in [true, false] {
                    let e = DirEntry {
                        fileid: 42 + len as u64,
                        name: layerfs_vfs::Name::from_elem(b'n', len),
                        cookie: u64::MAX - len as u64,
                        attr: with_attr.then_some(attr),
                    };
                    let h = with_handle.then_some(&handle);
                    packed.pack(&e, 0xfeed, h);
                    assert_eq!(
                        packed.bytes(),
                        by_nfs3_types(&e, 0xfeed, h),
                        "name of {len}, attributes {with_attr}, handle {with_handle}"
                    );
                }
            }
        }
    }
}
