//! Whiteouts and opaque directories, the OCI way (`.wh.NAME` hides `NAME`
//! below; `.wh..wh..opq` in a directory hides everything below it): the one
//! place that reads, makes and removes them.

use std::ffi::{CStr, CString};
use std::os::fd::BorrowedFd;

use layerfs_vfs::hostdir::{self, cstr};
use layerfs_vfs::{Error, Result};
use rustix::fs::{AtFlags, Mode, OFlags};

use crate::{OPAQUE_MARKER, WHITEOUT_PREFIX};

/// The name of the whiteout that hides `name`.
pub fn whiteout_name(name: &[u8]) -> Result<CString> {
    let mut w = WHITEOUT_PREFIX.as_bytes().to_vec();
    w.extend_from_slice(name);
    if w.len() > layerfs_vfs::NAME_MAX {
        // Such a name can be created but, being in a lower layer, not removed.
        return Err(Error::NameTooLong);
    }
    hostdir::cstr(&w)
}

/// What an entry's name makes it in a layer.
#[derive(Debug, PartialEq, Eq)]
pub enum Named<'a> {
    /// A file the layer shows.
    Shown,
    /// The marker that makes its directory opaque.
    Opaque,
    /// A whiteout hiding the name given below.
    Whiteout(&'a [u8]),
}

pub fn named(name: &[u8]) -> Named<'_> {
    match name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
        Some(_) if name == OPAQUE_MARKER.as_bytes() => Named::Opaque,
        Some(hidden) => Named::Whiteout(hidden),
        None => Named::Shown,
    }
}

/// Whether names starting so are whiteouts and markers, never shown.
pub fn is_hidden(name: &[u8]) -> bool {
    name.starts_with(WHITEOUT_PREFIX.as_bytes())
}

/// Whether `name` exists in `dir`.
pub fn exists(dir: BorrowedFd<'_>, name: &CStr) -> Result<bool> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NAMETOOLONG) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `dir` holds a whiteout for `name`.
pub fn has_whiteout(dir: BorrowedFd<'_>, name: &[u8]) -> Result<bool> {
    match whiteout_name(name) {
        Ok(w) => exists(dir, &w),
        Err(_) => Ok(false),
    }
}

/// Whether `dir` is opaque: it hides everything below it.
pub fn is_opaque(dir: BorrowedFd<'_>) -> Result<bool> {
    exists(dir, &CString::new(OPAQUE_MARKER).expect("no NUL"))
}

/// Makes the empty marker file `name` in `dir`, if it is not there.
fn make_marker(dir: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    let flags = OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC;
    hostdir::lending_write(&[dir], || {
        rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?;
        Ok(())
    })
}

/// Makes directory `dir` opaque. Its access and modification times stay:
/// the marker is a file only because a layer is a plain directory tree,
/// and no client changed the directory (overlayfs marks it with an xattr,
/// which changes neither).
pub fn mark_opaque(dir: BorrowedFd<'_>) -> Result<()> {
    let before = hostdir::host_attr(dir)?;
    make_marker(dir, &CString::new(OPAQUE_MARKER).expect("no NUL"))?;
    let times = layerfs_vfs::SetAttr {
        atime: layerfs_vfs::SetTime::Client(before.atime),
        mtime: layerfs_vfs::SetTime::Client(before.mtime),
        ..layerfs_vfs::SetAttr::default()
    };
    if let Some(times) = hostdir::timestamps(&times) {
        rustix::fs::futimens(dir, &times)?;
    }
    Ok(())
}

/// Makes a whiteout for `name` in the upper directory `dir`.
pub fn whiteout(dir: BorrowedFd<'_>, name: &[u8]) -> Result<()> {
    make_marker(dir, &whiteout_name(name)?)
}

/// Removes the whiteout for `name` in `dir`, if any.
pub fn clear_whiteout(dir: BorrowedFd<'_>, name: &[u8]) -> Result<()> {
    let Ok(w) = whiteout_name(name) else {
        return Ok(());
    };
    match rustix::fs::unlinkat(dir, &w, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Empties an upper directory that shows nothing: it holds only whiteouts
/// and markers.
pub fn clear_markers(dir: BorrowedFd<'_>) -> Result<()> {
    for (name, _, _) in hostdir::list(dir)? {
        if is_hidden(&name) {
            let name = cstr(&name)?;
            hostdir::lending_write(&[dir], || {
                Ok(rustix::fs::unlinkat(dir, &name, AtFlags::empty())?)
            })?;
        } else {
            return Err(Error::NotEmpty);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_what_they_are() {
        assert_eq!(named(b"file"), Named::Shown);
        assert_eq!(named(b".wh.file"), Named::Whiteout(b"file"));
        assert_eq!(named(b".wh..wh..opq"), Named::Opaque);
        assert_eq!(named(b".whx"), Named::Shown);
        assert!(is_hidden(b".wh..wh..layerfs"));
        assert_eq!(whiteout_name(b"a").unwrap().as_bytes(), b".wh.a");
        assert_eq!(whiteout_name(&[b'x'; 252]), Err(Error::NameTooLong));
    }
}
