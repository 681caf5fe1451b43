//! The rules a local kernel would apply: valid names, who may change which
//! attributes, and how times are set.

use std::ffi::{CStr, CString};
use std::os::fd::BorrowedFd;

use rustix::fs::{AtFlags, Timestamps};

use crate::access::{self, Caller, Perm};
use crate::attr::{Attr, FileKind, SetAttr, SetTime, Timestamp};
use crate::error::{Error, Result};
use crate::NAME_MAX;

/// The verifier of an exclusive create, kept in the new file's times as the
/// Linux server does, so a retransmission is recognised even after a restart.
pub fn exclusive_times(verf: [u8; 8]) -> (Timestamp, Timestamp) {
    let word =
        |b: &[u8]| i64::from(u32::from_be_bytes(b.try_into().expect("4 bytes")) & 0x7fff_ffff);
    (
        Timestamp {
            secs: word(&verf[..4]),
            nanos: 0,
        },
        Timestamp {
            secs: word(&verf[4..]),
            nanos: 0,
        },
    )
}

pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Inval);
    }
    Ok(())
}

pub fn cstr(name: &[u8]) -> Result<CString> {
    CString::new(name).map_err(|_| Error::Inval)
}

/// A name a new entry may take.
pub fn creatable(name: &[u8]) -> Result<CString> {
    check_name(name)?;
    if name == b"." || name == b".." {
        return Err(Error::Exist);
    }
    cstr(name)
}

/// A name an existing entry may be removed or renamed by.
pub fn removable(name: &[u8]) -> Result<CString> {
    check_name(name)?;
    if name == b"." || name == b".." {
        return Err(Error::Inval);
    }
    cstr(name)
}

/// Who may change what (chmod, chown, utimes, truncate), as a local kernel
/// decides; returns the change as that kernel applies it for this caller.
/// The server itself runs with every privilege, so what the kernel would do
/// for an unprivileged caller is done here: a chmod by a caller outside the
/// file's group drops S_ISGID, a truncate drops setuid and setgid.
pub fn check_setattr(caller: &Caller, attr: &Attr, set: &SetAttr) -> Result<SetAttr> {
    if caller.is_root() {
        return Ok(*set);
    }
    let owner = caller.uid == attr.uid;
    if set.mode.is_some() && !owner && !drops_privilege_only(caller, attr, set) {
        return Err(Error::Perm);
    }
    // Only the owner may "change" the owner to itself, or the group to one
    // it is in (or the same group).
    if set.uid.is_some_and(|uid| !(owner && uid == attr.uid)) {
        return Err(Error::Perm);
    }
    if set
        .gid
        .is_some_and(|gid| !(owner && (gid == attr.gid || caller.in_group(gid))))
    {
        return Err(Error::Perm);
    }
    let explicit_time =
        matches!(set.atime, SetTime::Client(_)) || matches!(set.mtime, SetTime::Client(_));
    if explicit_time && !owner {
        return Err(Error::Perm);
    }
    let now_time = set.atime == SetTime::ServerNow || set.mtime == SetTime::ServerNow;
    if now_time && !access::owner_may(attr, caller, Perm::WRITE) {
        return Err(Error::Access);
    }
    if set.size.is_some() && !access::owner_may(attr, caller, Perm::WRITE) {
        return Err(Error::Access);
    }
    let mut applied = *set;
    if let Some(mode) = &mut applied.mode {
        if !caller.in_group(set.gid.unwrap_or(attr.gid)) {
            *mode &= !0o2000;
        }
    } else if set.size.is_some() {
        applied.mode = mode_after_write(caller, attr);
    }
    Ok(applied)
}

/// Whether the mode `set` asks for is what a write by `caller` would leave
/// (setuid, and setgid with group execute, cleared), with no change of
/// owner, and `caller` may write the file: anyone who may write may do
/// that, as a write of theirs does it. A FUSE kernel clears the bits so,
/// asking as the writer, before a write or truncate by a caller without
/// `CAP_FSETID`.
fn drops_privilege_only(caller: &Caller, attr: &Attr, set: &SetAttr) -> bool {
    let Some(mode) = set.mode else {
        return false;
    };
    let lesser = mode_without_privilege(attr).map(|m| m & 0o7777);
    lesser == Some(mode & 0o7777)
        && set.uid.is_none()
        && set.gid.is_none()
        && access::permits(attr, caller, Perm::WRITE)
}

/// The mode a file takes when `caller` writes to or truncates it, if that
/// changes it: a caller without privilege drops setuid, and setgid where
/// group execute is set (without it, setgid marks mandatory locking, not
/// privilege), as the kernel does.
pub fn mode_after_write(caller: &Caller, attr: &Attr) -> Option<u32> {
    if caller.is_root() {
        return None;
    }
    mode_without_privilege(attr)
}

/// The mode [`mode_after_write`] gives a file for a caller without
/// privilege, if that changes it.
pub fn mode_without_privilege(attr: &Attr) -> Option<u32> {
    if attr.kind != FileKind::Regular {
        return None;
    }
    let mut mode = attr.mode & !0o4000;
    if mode & 0o010 != 0 {
        mode &= !0o2000;
    }
    (mode != attr.mode).then_some(mode)
}

/// The mode a new entry gets when `caller` asks for `asked`: the bits asked
/// for, with no umask of the server's; a directory in a setgid directory
/// keeps the setgid it inherited; a file whose group the caller is not in
/// loses setgid.
pub fn mode_of_new(caller: &Caller, asked: u32, made: &Attr) -> u32 {
    let mut mode = asked & 0o7777;
    if made.kind == FileKind::Directory {
        mode |= made.mode & 0o2000;
    } else if !caller.is_root() && !caller.in_group(made.gid) {
        mode &= !0o2000;
    }
    mode
}

/// Applies the time part of `set` to `name` in `dir` without following a symlink.
pub fn apply(dir: BorrowedFd<'_>, name: &CStr, set: &SetAttr) -> Result<()> {
    if let Some(times) = timestamps(set) {
        rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    }
    Ok(())
}

/// The time part of `set` as `utimensat` takes it; `None` when it keeps both.
pub fn timestamps(set: &SetAttr) -> Option<Timestamps> {
    if set.atime == SetTime::Keep && set.mtime == SetTime::Keep {
        return None;
    }
    let spec = |t: SetTime| match t {
        SetTime::Keep => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        SetTime::ServerNow => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        SetTime::Client(t) => rustix::fs::Timespec {
            tv_sec: t.secs,
            tv_nsec: i64::from(t.nanos) as _,
        },
    };
    Some(Timestamps {
        last_access: spec(set.atime),
        last_modification: spec(set.mtime),
    })
}

/// The sticky-bit rule: in a sticky directory only the owner of the entry or
/// of the directory (or root) may remove or rename the entry.
pub fn sticky_allows(caller: &Caller, dir: &Attr, entry: &Attr) -> Result<()> {
    if dir.mode & 0o1000 != 0
        && !caller.is_root()
        && caller.uid != dir.uid
        && caller.uid != entry.uid
    {
        return Err(Error::Perm);
    }
    Ok(())
}

/// Whether `caller` may add or remove entries of a directory it may search.
pub fn may_change_entries(caller: &Caller, dir: &Attr) -> Result<()> {
    match access::permits(dir, caller, Perm::WRITE) {
        true => Ok(()),
        false => Err(Error::Access),
    }
}

/// The checks a local kernel makes before a rename, in its order: write
/// permission on both directories, the sticky rule for the entry moved and
/// the one replaced, and, for a directory moving to another parent, write
/// permission on the directory itself (its `..` changes).
pub fn may_rename(
    caller: &Caller,
    (from_dir, moving): (&Attr, &Attr),
    (to_dir, replaced): (&Attr, Option<&Attr>),
) -> Result<()> {
    may_change_entries(caller, from_dir)?;
    sticky_allows(caller, from_dir, moving)?;
    may_change_entries(caller, to_dir)?;
    if let Some(target) = replaced {
        sticky_allows(caller, to_dir, target)?;
    }
    let new_parent = from_dir.fileid != to_dir.fileid;
    if moving.kind == FileKind::Directory
        && new_parent
        && !access::permits(moving, caller, Perm::WRITE)
    {
        return Err(Error::Access);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32) -> Caller {
        Caller {
            uid,
            gid: uid,
            gids: Default::default(),
        }
    }

    fn file(mode: u32, owner: u32) -> Attr {
        Attr {
            mode,
            uid: owner,
            gid: owner,
            ..Attr::blank(FileKind::Regular)
        }
    }

    fn chmod(mode: u32) -> SetAttr {
        SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        }
    }

    #[test]
    fn a_caller_who_may_write_may_clear_the_setuid_a_write_of_theirs_clears_and_nothing_more() {
        let other = caller(65534);
        // Writable by all, owned by someone else: what a write leaves.
        let f = file(0o6777, 65533);
        assert_eq!(
            check_setattr(&other, &f, &chmod(0o777)).unwrap().mode,
            Some(0o777)
        );
        // As the kernel asks with a truncate.
        let truncate = SetAttr {
            size: Some(0),
            ..chmod(0o777)
        };
        assert!(check_setattr(&other, &f, &truncate).is_ok());
        // Any other mode is the owner's to set.
        for mode in [0o2777, 0o4777, 0o775, 0o7777] {
            assert_eq!(
                check_setattr(&other, &f, &chmod(mode)),
                Err(Error::Perm),
                "{mode:o}"
            );
        }
        // Setgid without group execute stays, as a write leaves it.
        let locking = file(0o6766, 65533);
        assert!(check_setattr(&other, &locking, &chmod(0o2766)).is_ok());
        assert_eq!(
            check_setattr(&other, &locking, &chmod(0o766)),
            Err(Error::Perm)
        );
        // Only for a caller who may write.
        let readonly = file(0o6755, 65533);
        assert_eq!(
            check_setattr(&other, &readonly, &chmod(0o755)),
            Err(Error::Perm)
        );
        // Nor with a change of owner beside it.
        let chown = SetAttr {
            uid: Some(65533),
            ..chmod(0o777)
        };
        assert_eq!(check_setattr(&other, &f, &chown), Err(Error::Perm));
        // A file without those bits: no chmod at all by another user.
        assert_eq!(
            check_setattr(&other, &file(0o777, 65533), &chmod(0o777)),
            Err(Error::Perm)
        );
    }
}
