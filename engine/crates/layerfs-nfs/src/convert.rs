//! Between the filesystem's types and NFSv3's wire types.

use layerfs_rpc::xdr::Append;
use layerfs_vfs::{Attr, Change, FileKind, Timestamp};
use nfs3_types::nfs3::{
    fattr3, ftype3, nfstime3, post_op_attr, pre_op_attr, specdata3, wcc_attr, wcc_data, Nfs3Option,
};

/// NFSv3 times are unsigned 32-bit seconds: earlier clamps to the epoch,
/// later than 2106 to its last second.
pub fn time(t: Timestamp) -> nfstime3 {
    nfstime3 {
        seconds: t.secs.clamp(0, i64::from(u32::MAX)) as u32,
        nseconds: if t.secs < 0 { 0 } else { t.nanos },
    }
}

pub fn ftype(kind: FileKind) -> ftype3 {
    match kind {
        FileKind::Regular => ftype3::NF3REG,
        FileKind::Directory => ftype3::NF3DIR,
        FileKind::Symlink => ftype3::NF3LNK,
        FileKind::BlockDevice => ftype3::NF3BLK,
        FileKind::CharDevice => ftype3::NF3CHR,
        FileKind::Fifo => ftype3::NF3FIFO,
        FileKind::Socket => ftype3::NF3SOCK,
    }
}

pub fn fattr(a: &Attr, fsid: u64) -> fattr3 {
    fattr3 {
        type_: ftype(a.kind),
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        used: a.used,
        rdev: specdata3 {
            specdata1: a.rdev.0,
            specdata2: a.rdev.1,
        },
        fsid,
        fileid: a.fileid,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
    }
}

pub fn post_op(a: Option<&Attr>, fsid: u64) -> post_op_attr {
    match a {
        Some(a) => Nfs3Option::Some(fattr(a, fsid)),
        None => Nfs3Option::None,
    }
}

/// [`post_op`] appended item by item (listings): the same fields, from
/// the same [`fattr`].
pub fn append_post_op(out: &mut Vec<u8>, a: Option<&Attr>, fsid: u64) {
    let Some(a) = a else {
        out.put_bool(false);
        return;
    };
    let a = fattr(a, fsid);
    out.put_bool(true);
    for word in [a.type_ as u32, a.mode, a.nlink, a.uid, a.gid] {
        out.put_u32(word);
    }
    out.put_u64(a.size);
    out.put_u64(a.used);
    out.put_u32(a.rdev.specdata1);
    out.put_u32(a.rdev.specdata2);
    out.put_u64(a.fsid);
    out.put_u64(a.fileid);
    for t in [a.atime, a.mtime, a.ctime] {
        out.put_u32(t.seconds);
        out.put_u32(t.nseconds);
    }
}

pub fn wcc(c: &Change, fsid: u64) -> wcc_data {
    wcc_data {
        before: match c.before {
            Some(b) => pre_op_attr::Some(wcc_attr {
                size: b.size,
                mtime: time(b.mtime),
                ctime: time(b.ctime),
            }),
            None => pre_op_attr::None,
        },
        after: post_op(c.after.as_ref(), fsid),
    }
}

/// Weak cache consistency data for a failed change: what is known after it.
pub fn wcc_after(after: Option<&Attr>, fsid: u64) -> wcc_data {
    wcc_data {
        before: pre_op_attr::None,
        after: post_op(after, fsid),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn times_outside_nfsv3_range_clamp() {
        assert_eq!(
            time(Timestamp { secs: -5, nanos: 7 }),
            nfstime3 {
                seconds: 0,
                nseconds: 0
            }
        );
        let late = time(Timestamp {
            secs: 1 << 33,
            nanos: 1,
        });
        assert_eq!(late.seconds, u32::MAX);
        let now = Timestamp {
            secs: 1_790_000_000,
            nanos: 123,
        };
        assert_eq!(
            (time(now).seconds, time(now).nseconds),
            (1_790_000_000, 123)
        );
    }

    /// Attributes whose every field is far from zero, with times before
    /// the epoch, within range and past 2106 (clamped alike by both
    /// encoders).
    pub(crate) fn unusual_attr() -> Attr {
        Attr {
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
            atime: Timestamp { secs: -5, nanos: 7 },
            mtime: Timestamp {
                secs: 1_700_000_000,
                nanos: 999_999_999,
            },
            ctime: Timestamp {
                secs: 1 << 40,
                nanos: 1,
            },
        }
    }

    #[test]
    fn appended_attributes_are_what_nfs3_types_packs() {
        use nfs3_types::xdr_codec::Pack;
        let attr = unusual_attr();
        for a in [Some(&attr), None] {
            let mut ours = Vec::new();
            append_post_op(&mut ours, a, 0xfeed);
            let mut theirs = Vec::new();
            post_op(a, 0xfeed).pack(&mut theirs).unwrap();
            assert_eq!(ours, theirs, "attributes {}", a.is_some());
        }
    }
}
