//! Extended attributes as layers keep them: which names, and reading them
//! from a host file without a path walk where a descriptor is at hand.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::io::Errno;

/// A name and its value.
pub type Xattrs = Vec<(OsString, Vec<u8>)>;

/// Whether a layer keeps the extended attribute `name`: `user.`, POSIX
/// ACLs, and as root `trusted.` and file capabilities. overlayfs' own
/// `trusted.overlay.` marks and other `security.` labels belong to the host
/// the files came from, not to the layer, and are dropped.
pub(crate) fn keeps(name: &[u8], as_root: bool) -> bool {
    if name.starts_with(b"user.") || name.starts_with(b"system.posix_acl_") {
        return true;
    }
    if name.starts_with(b"trusted.overlay.") {
        return false;
    }
    as_root && (name.starts_with(b"trusted.") || name == b"security.capability")
}

/// Where to read attributes from: an open descriptor, or for what cannot
/// be opened (a symlink, a device) its path, not followed.
#[derive(Clone, Copy)]
pub(crate) enum On<'a> {
    Fd(BorrowedFd<'a>),
    Path(&'a Path),
}

/// The attributes of `on` whose names pass `keep`, sorted by name.
pub(crate) fn read(on: On<'_>, keep: impl Fn(&[u8]) -> bool) -> io::Result<Xattrs> {
    // Most files have none: a small buffer first, the kernel's limit (64 KiB
    // for a list and for a value) only when it is too small.
    let mut small = [0u8; 512];
    let mut large = Vec::new();
    let list = match list(on, &mut small) {
        Ok(n) => &small[..n],
        Err(Errno::RANGE) => {
            large.resize(64 * 1024, 0);
            let n = list(on, &mut large)?;
            &large[..n]
        }
        Err(Errno::NOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut names: Vec<&[u8]> = list
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty() && keep(n))
        .collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    names.sort();
    let mut value = vec![0u8; 64 * 1024];
    let mut kept = Vec::with_capacity(names.len());
    for name in names {
        let name = OsStr::from_bytes(name);
        let got = match on {
            On::Fd(fd) => rustix::fs::fgetxattr(fd, name, &mut value[..]),
            On::Path(path) => rustix::fs::lgetxattr(path, name, &mut value[..]),
        };
        match got {
            Ok(n) => kept.push((name.to_os_string(), value[..n].to_vec())),
            // Gone between the listing and the read.
            Err(Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(kept)
}

fn list(on: On<'_>, buf: &mut [u8]) -> rustix::io::Result<usize> {
    match on {
        On::Fd(fd) => rustix::fs::flistxattr(fd, buf),
        On::Path(path) => rustix::fs::llistxattr(path, buf),
    }
}

/// The extended attributes of `path` (not following a symlink) that a layer
/// keeps, sorted by name: what a layer's file carries into an image.
pub fn kept_xattrs(path: &Path) -> io::Result<Xattrs> {
    read(On::Path(path), |n| keeps(n, true))
}
