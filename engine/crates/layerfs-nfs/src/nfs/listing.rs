//! READDIR and READDIRPLUS: pages of a directory within the client's byte
//! budgets. Entries are appended to the reply one by one with [`Append`],
//! each measured as it is written; the one that would pass a budget is cut
//! off again. No entry's size is counted by hand.

use std::sync::LazyLock;

use layerfs_rpc::xdr::{padded, Append};
use layerfs_rpc::{Refusal, ReplyBuf};
use layerfs_vfs::{Attr, Caller, DirEntry, DirPage, FileKind};
use nfs3_types::nfs3::*;

use super::{put, Served};
use crate::convert::{append_post_op, post_op};
use crate::error::{status, Error};
use crate::handle::{Checked, LEN as HANDLE_LEN};

/// What follows a list's last entry: the end-of-list marker and eof, two
/// XDR booleans.
const LIST_END: usize = 8;

impl Served<'_> {
    /// A page of the directory a handle names, after `cookie`, at most
    /// `max` entries, and the cookie verifier; on failure, the directory's
    /// attributes if the handle still names it.
    fn page(
        &self,
        who: &Caller,
        dir: Checked,
        (cookie, verf): (u64, [u8; 8]),
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
        if cookie != 0 && verf != [0; 8] && verf != ours.0 {
            return Err((Error::BadCookie, Some(attr)));
        }
        Ok((page, ours))
    }

    pub(super) fn readdir(
        &self,
        who: &Caller,
        (dir, at, budget): (Checked, (u64, [u8; 8]), u32),
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let fail = |e: Error, attr: Option<&Attr>, reply: &mut ReplyBuf| {
            put(
                reply,
                &READDIR3res::Err((
                    status(e),
                    READDIR3resfail {
                        dir_attributes: post_op(attr, self.fsid()),
                    },
                )),
            )
        };
        let budget = budget as usize;
        let most = budget / SIZES.smallest(SIZES.plain) + 2;
        let (page, verf) = match self.page(who, dir, at, most, false) {
            Ok(found) => found,
            Err((e, attr)) => return fail(e, attr.as_ref(), reply),
        };
        let at_most = |e: &DirEntry| SIZES.plain + padded(e.name.len());
        let listed = self.list(reply, &page, &verf, (budget, 0), at_most, |out, e| {
            append_entry(out, e)
        })?;
        if listed {
            Ok(())
        } else {
            fail(Error::TooSmall, Some(&page.dir), reply)
        }
    }

    pub(super) fn readdirplus(
        &self,
        who: &Caller,
        (dir, at, budgets): (Checked, (u64, [u8; 8]), (u32, u32)),
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
        let budgets = (budgets.0 as usize, budgets.1 as usize);
        // Ask the filesystem (and its stat calls) for no more entries than
        // the smallest would fill.
        let most = (budgets.0 / SIZES.smallest(SIZES.plus)).min(match budgets.1 {
            0 => usize::MAX,
            dir => dir / SIZES.smallest(SIZES.dir_info),
        }) + 2;
        let (page, verf) = match self.page(who, dir, at, most, true) {
            Ok(found) => found,
            Err((e, attr)) => return fail(e, attr.as_ref(), reply),
        };
        let fsid = self.fsid();
        let mut sign = self.export.listing_signer();
        let at_most = |e: &DirEntry| SIZES.plus + padded(e.name.len());
        let listed = self.list(reply, &page, &verf, budgets, at_most, |out, e| {
            let handle = e.attr.as_ref().map(&mut sign);
            append_entry_plus(out, e, fsid, handle.as_ref())
        })?;
        if listed {
            Ok(())
        } else {
            fail(Error::TooSmall, Some(&page.dir), reply)
        }
    }

    /// A successful listing's results: the directory's attributes, the
    /// verifier, and the entries `append` writes while the reply stays
    /// within `budget` bytes and their directory information within
    /// `dir_budget` (0: no such limit). False, with nothing written, when
    /// not even the first entry fits. `at_most` bounds an entry's size, for
    /// the room taken once before.
    fn list(
        &self,
        reply: &mut ReplyBuf,
        page: &DirPage,
        verf: &cookieverf3,
        (budget, dir_budget): (usize, usize),
        at_most: impl Fn(&DirEntry) -> usize,
        mut append: impl FnMut(&mut Vec<u8>, &DirEntry) -> usize,
    ) -> Result<bool, Refusal> {
        let start = reply.body_len();
        put(reply, &nfsstat3::NFS3_OK)?;
        put(reply, &post_op(Some(&page.dir), self.fsid()))?;
        put(reply, verf)?;
        let written = reply.body_len() - start;
        let room = page.entries.iter().map(at_most).sum::<usize>() + LIST_END;
        reply.reserve(room.min(budget.saturating_sub(written)));
        let fit = reply.append_with(|out| {
            let begun = out.len() - written;
            let (mut fit, mut dir_used) = (0, 0);
            for e in &page.entries {
                let mark = out.len();
                let dir_info = append(out, e);
                if out.len() - begun + LIST_END > budget
                    || (dir_budget > 0 && fit > 0 && dir_used + dir_info > dir_budget)
                {
                    out.truncate(mark);
                    break;
                }
                dir_used += dir_info;
                fit += 1;
            }
            fit
        });
        if fit == 0 && !page.entries.is_empty() {
            reply.truncate_body(start);
            return Ok(false);
        }
        put(reply, &false)?;
        put(reply, &(page.eof && fit == page.entries.len()))?;
        Ok(true)
    }
}

/// Appends an `entry3` with the list marker before it. Returns the size of
/// its directory information (fileid, name, cookie), which READDIRPLUS's
/// `dircount` counts.
fn append_entry(out: &mut Vec<u8>, e: &DirEntry) -> usize {
    out.put_bool(true);
    let at = out.len();
    out.put_u64(e.fileid);
    out.put_opaque(&e.name);
    out.put_u64(e.cookie);
    out.len() - at
}

/// Appends an `entryplus3` with the list marker before it: an `entry3`'s
/// fields, the attributes and the handle. Returns the size of its
/// directory information.
fn append_entry_plus(
    out: &mut Vec<u8>,
    e: &DirEntry,
    fsid: u64,
    handle: Option<&[u8; HANDLE_LEN]>,
) -> usize {
    let dir_info = append_entry(out, e);
    append_post_op(out, e.attr.as_ref(), fsid);
    match handle {
        Some(handle) => {
            out.put_bool(true);
            out.put_opaque(handle);
        }
        None => out.put_bool(false),
    }
    dir_info
}

/// The sizes of entries with an empty name, as the encoders above write
/// them; a name of `n` bytes adds `padded(n)`.
struct EntrySizes {
    /// An `entry3` with its list marker.
    plain: usize,
    /// An `entryplus3` with attributes and a handle, with its list marker.
    plus: usize,
    /// An entry's directory information.
    dir_info: usize,
}

impl EntrySizes {
    /// An entry of `size` with the shortest name (one byte).
    fn smallest(&self, size: usize) -> usize {
        size + padded(1)
    }
}

static SIZES: LazyLock<EntrySizes> = LazyLock::new(|| {
    let e = DirEntry {
        fileid: 0,
        name: Default::default(),
        cookie: 0,
        attr: Some(Attr::blank(FileKind::Regular)),
    };
    let mut out = Vec::new();
    let dir_info = append_entry(&mut out, &e);
    let plain = out.len();
    out.clear();
    append_entry_plus(&mut out, &e, 0, Some(&[0; HANDLE_LEN]));
    EntrySizes {
        plain,
        plus: out.len(),
        dir_info,
    }
});

#[cfg(test)]
mod tests {
    use super::*;
    use nfs3_types::xdr_codec::{Opaque, Pack};

    /// What nfs3_types packs for the same entry, its list marker first.
    fn by_nfs3_types<'a>(
        e: &'a DirEntry,
        fsid: u64,
        handle: Option<&'a [u8; HANDLE_LEN]>,
    ) -> (Vec<u8>, Vec<u8>) {
        let plus = entryplus3 {
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
        let plain = entry3 {
            fileid: e.fileid,
            name: filename3(Opaque::borrowed(&e.name)),
            cookie: e.cookie,
        };
        let (mut p, mut q) = (Vec::new(), Vec::new());
        true.pack(&mut p).unwrap();
        plus.pack(&mut p).unwrap();
        true.pack(&mut q).unwrap();
        plain.pack(&mut q).unwrap();
        (p, q)
    }

    #[test]
    fn entries_append_as_nfs3_types_packs_them_and_their_sizes_hold() {
        let attr = crate::convert::tests::unusual_attr();
        let handle: [u8; HANDLE_LEN] = std::array::from_fn(|i| i as u8);
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
                    let what =
                        format!("name of {len}, attributes {with_attr}, handle {with_handle}");
                    let (plus, plain) = by_nfs3_types(&e, 0xfeed, h);
                    let mut out = Vec::new();
                    let dir_info = append_entry_plus(&mut out, &e, 0xfeed, h);
                    assert_eq!(out, plus, "{what}");
                    assert_eq!(dir_info, SIZES.dir_info + padded(len), "{what}");
                    let bound = SIZES.plus + padded(len);
                    assert!(out.len() <= bound, "{what}");
                    if with_attr && with_handle {
                        assert_eq!(out.len(), bound, "{what}");
                    }
                    out.clear();
                    append_entry(&mut out, &e);
                    assert_eq!(out, plain, "{what}");
                    assert_eq!(out.len(), SIZES.plain + padded(len), "{what}");
                }
            }
        }
    }
}
