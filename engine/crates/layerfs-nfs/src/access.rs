//! NFSv3 ACCESS (RFC 1813 §3.3.4): which of the asked rights a caller holds,
//! from the same mode-bit rule every other check uses.

use layerfs_vfs::access::{permits, Perm};
use layerfs_vfs::{Attr, Caller, FileKind};

/// NFSv3 ACCESS bits (RFC 1813 §3.3.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access(pub u32);

impl Access {
    pub const READ: u32 = 0x01;
    pub const LOOKUP: u32 = 0x02;
    pub const MODIFY: u32 = 0x04;
    pub const EXTEND: u32 = 0x08;
    pub const DELETE: u32 = 0x10;
    pub const EXECUTE: u32 = 0x20;
}

/// The ACCESS bits among `asked` that `caller` holds on a file with `attr`.
pub fn granted(attr: &Attr, caller: &Caller, asked: u32) -> u32 {
    let mut out = 0;
    let r = permits(attr, caller, Perm::READ);
    let w = permits(attr, caller, Perm::WRITE);
    let x = permits(attr, caller, Perm::EXEC);
    if r {
        out |= Access::READ;
    }
    if attr.kind == FileKind::Directory {
        if x {
            out |= Access::LOOKUP;
        }
        if w && x {
            out |= Access::MODIFY | Access::EXTEND | Access::DELETE;
        }
    } else {
        if w {
            out |= Access::MODIFY | Access::EXTEND;
        }
        if x {
            out |= Access::EXECUTE;
        }
    }
    out & asked
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
    fn access_bits_for_files_and_directories() {
        let all = 0x3f;
        let d = attr(FileKind::Directory, 0o755, 10, 20);
        assert_eq!(granted(&d, &user(10, 20, &[]), all), 0x1f);
        assert_eq!(
            granted(&d, &user(11, 21, &[]), all),
            Access::READ | Access::LOOKUP
        );
        let f = attr(FileKind::Regular, 0o754, 10, 20);
        assert_eq!(
            granted(&f, &user(11, 20, &[]), all),
            Access::READ | Access::EXECUTE
        );
        assert_eq!(granted(&f, &user(12, 21, &[]), Access::MODIFY), 0);
    }
}
