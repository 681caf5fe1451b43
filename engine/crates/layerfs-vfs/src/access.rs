//! Permission checks from mode bits and the caller's identity.
//!
//! A door usually runs as root, so the host does not check for it: every
//! operation checks here first, the way a local kernel would for the caller.

use crate::attr::{Attr, FileKind};

/// A caller's supplementary groups, kept inline up to AUTH_SYS's limit of 16
/// so that naming a caller for a call allocates nothing.
pub type Groups = smallvec::SmallVec<[u32; 16]>;

/// Who is asking: the uid and groups a door was given (AUTH_SYS over NFS,
/// the request and `/proc` over FUSE).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub gids: Groups,
}

impl Caller {
    /// The superuser, which every check lets through.
    pub fn root() -> Caller {
        Caller {
            uid: 0,
            gid: 0,
            gids: Groups::new(),
        }
    }

    /// A caller that sent no credentials (AUTH_NONE): nobody.
    pub fn nobody() -> Caller {
        Caller {
            uid: 65534,
            gid: 65534,
            gids: Groups::new(),
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.gids.contains(&gid)
    }
}

bitflags::bitflags! {
    /// Permission a check asks for: a mode's rwx bits.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Perm: u32 {
        const READ = 4;
        const WRITE = 2;
        /// Execute a file, search a directory.
        const EXEC = 1;
    }
}

/// The rwx bits that apply to `caller` on a file with `attr`.
pub fn mode_class(attr: &Attr, caller: &Caller) -> Perm {
    let bits = if caller.uid == attr.uid {
        attr.mode >> 6
    } else if caller.in_group(attr.gid) {
        attr.mode >> 3
    } else {
        attr.mode
    };
    Perm::from_bits_truncate(bits & 7)
}

/// Whether `caller` holds all of `want` on the file. Root may read and
/// write anything, and execute what anyone may execute.
pub fn permits(attr: &Attr, caller: &Caller, want: Perm) -> bool {
    if caller.is_root() {
        let exec_ok = !want.contains(Perm::EXEC)
            || attr.kind == FileKind::Directory
            || attr.mode & 0o111 != 0;
        return exec_ok;
    }
    mode_class(attr, caller).contains(want)
}

/// Whether `caller` may do what the owner of a file may do whatever its
/// mode (read its link, set its times to now, truncate it, replace it
/// over...), else what `want` allows.
pub fn owner_may(attr: &Attr, caller: &Caller, want: Perm) -> bool {
    caller.uid == attr.uid || permits(attr, caller, want)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: FileKind, mode: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            mode,
            uid,
            gid,
            ..Attr::blank(kind)
        }
    }

    fn user(uid: u32, gid: u32, gids: &[u32]) -> Caller {
        Caller {
            uid,
            gid,
            gids: gids.into(),
        }
    }

    #[test]
    fn owner_group_and_other_classes() {
        let f = attr(FileKind::Regular, 0o640, 10, 20);
        assert!(permits(&f, &user(10, 99, &[]), Perm::READ | Perm::WRITE));
        assert!(permits(&f, &user(11, 99, &[20]), Perm::READ));
        assert!(!permits(&f, &user(11, 99, &[20]), Perm::WRITE));
        assert!(!permits(&f, &user(11, 99, &[]), Perm::READ));
        // The owner class applies even when it grants less than the group's.
        let odd = attr(FileKind::Regular, 0o070, 10, 20);
        assert!(!permits(&odd, &user(10, 20, &[]), Perm::READ));
    }

    #[test]
    fn root_reads_and_writes_but_executes_only_executables() {
        let f = attr(FileKind::Regular, 0o000, 10, 20);
        assert!(permits(&f, &Caller::root(), Perm::READ | Perm::WRITE));
        assert!(!permits(&f, &Caller::root(), Perm::EXEC));
        let d = attr(FileKind::Directory, 0o000, 10, 20);
        assert!(permits(&d, &Caller::root(), Perm::EXEC));
        // The owner may what its mode does not let it.
        let mine = attr(FileKind::Regular, 0o000, 10, 20);
        assert!(owner_may(&mine, &user(10, 99, &[]), Perm::WRITE));
        assert!(!owner_may(&mine, &user(11, 20, &[]), Perm::WRITE));
    }
}
