//! Extended attributes of a workspace's files, as kernel overlayfs keeps
//! them: read from the file's top instance, set on its upper copy (a
//! copy-up first, which brings the lower file's attributes along), hidden
//! with the file by a whiteout.
//!
//! The host calls go through `/proc/self/fd/DIR/NAME`: the kernel has no
//! `*xattrat` calls before 6.13, and a symlink or device cannot be opened
//! to be read. A regular file held open is read through its descriptor.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use layerfs_vfs::XattrFlags;
use layerfs_vfs::{Error, FileId, Result};
use rustix::buffer::spare_capacity;

use super::merge::{Found, Layers, UPPER};
use super::StackFs;
use crate::xattrs::{self, On, Xattrs};

/// The largest value or name list: the kernel's own limit.
const XATTR_MAX: usize = 64 * 1024;

/// The names a workspace serves: `user.`, `trusted.` (overlayfs' own
/// `trusted.overlay.` aside) and file capabilities. POSIX ACLs are not
/// served: the door does not have the kernel enforce them.
pub(super) fn serves(name: &[u8]) -> bool {
    !name.starts_with(b"system.") && xattrs::keeps(name, true)
}

/// The host path of `name` in the directory `dir`, not followed.
pub(super) fn path_in(dir: BorrowedFd<'_>, name: &[u8]) -> CString {
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    CString::new(path).unwrap_or_default()
}

fn path_of(found: &Found) -> CString {
    path_in(found.parent.as_fd(), found.name.as_bytes())
}

/// The attributes a workspace serves of `name` in `dir`, sorted by name.
pub(super) fn served(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Xattrs> {
    let path = path_in(dir, name);
    let path = std::path::Path::new(OsStr::from_bytes(path.as_bytes()));
    Ok(xattrs::read(On::Path(path), serves)?)
}

/// Copies the attributes a workspace serves of `from_name` in `from` to
/// `to_name` in `to`: a copy-up keeps them.
pub(super) fn copy(
    from: BorrowedFd<'_>,
    from_name: &[u8],
    to: BorrowedFd<'_>,
    to_name: &[u8],
) -> Result<()> {
    let to = path_in(to, to_name);
    set_each(served(from, from_name)?, |name, value, flags| {
        rustix::fs::lsetxattr(to.as_c_str(), name, value, flags)
    })
}

/// Gives the open file `fd` the attributes `kept`: a copy-up keeps them.
pub(super) fn set_on(fd: BorrowedFd<'_>, kept: Xattrs) -> Result<()> {
    set_each(kept, |name, value, flags| {
        rustix::fs::fsetxattr(fd, name, value, flags)
    })
}

fn set_each(
    kept: Xattrs,
    set: impl Fn(&OsStr, &[u8], rustix::fs::XattrFlags) -> rustix::io::Result<()>,
) -> Result<()> {
    for (name, value) in kept {
        match set(&name, &value, rustix::fs::XattrFlags::empty()) {
            Ok(()) => {}
            // A user. attribute on a symlink of an image made elsewhere.
            Err(rustix::io::Errno::PERM) if name.as_bytes().starts_with(b"user.") => {}
            // One only root may keep (a file capability), and a server
            // that is not root: the copy goes without it, as that user's
            // import of the layer would have, rather than the change the
            // copy-up is for failing.
            Err(rustix::io::Errno::PERM) if !xattrs::keeps(name.as_bytes(), false) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl StackFs {
    pub(super) fn get_xattr(&self, id: FileId, name: &[u8]) -> Result<Vec<u8>> {
        self.xattr_in(&self.tree.current(), id, name)
    }

    /// [`get_xattr`](Self::get_xattr) in `layers`, which the caller holds.
    fn xattr_in(&self, layers: &Layers, id: FileId, name: &[u8]) -> Result<Vec<u8>> {
        if !serves(name) {
            return Err(Error::NoData);
        }
        let name = OsStr::from_bytes(name);
        let mut value = Vec::with_capacity(XATTR_MAX);
        // A file held open is asked through its descriptor: the kernel asks
        // for `security.capability` before the first write through each
        // open, and then the file is open here.
        match self.tree.caches.file(id, layers.generation) {
            Some((_, file)) => file.get_xattr(name, &mut value)?,
            None => {
                let found = self.tree.found(layers, id)?;
                rustix::fs::lgetxattr(
                    path_of(&found).as_c_str(),
                    name,
                    spare_capacity(&mut value),
                )?;
            }
        }
        Ok(value)
    }

    pub(super) fn list_xattrs(&self, id: FileId) -> Result<Vec<u8>> {
        let found = self.tree.found(&self.tree.current(), id)?;
        let path = path_of(&found);
        let mut all = Vec::with_capacity(XATTR_MAX);
        rustix::fs::llistxattr(path.as_c_str(), spare_capacity(&mut all))?;
        let mut names = Vec::new();
        for name in all
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty() && serves(n))
        {
            names.extend_from_slice(name);
            names.push(0);
        }
        Ok(names)
    }

    /// Sets or removes (`value` `None`) attribute `name` on the upper copy
    /// of `id`, copied up first.
    pub(super) fn change_xattr(
        &self,
        id: FileId,
        name: &[u8],
        value: Option<(&[u8], XattrFlags)>,
    ) -> Result<()> {
        if !serves(name) {
            return Err(Error::NotSupp);
        }
        let layers = self.tree.read_layers();
        let c = self.changing(&layers);
        let before = self.tree.found(&layers, id)?;
        if before.layer != UPPER {
            // Asked in the layers held: reading them again here could wait
            // behind a writer queued meanwhile (see order.rs).
            if value.is_none() && self.xattr_in(&layers, id, name).is_err() {
                return Err(Error::NoData);
            }
            c.copy_up(id)?;
        }
        let found = self.tree.found(&layers, id)?;
        let path = path_of(&found);
        let name = OsStr::from_bytes(name);
        match value {
            Some((value, flags)) => {
                let flags = match flags {
                    XattrFlags::Either => rustix::fs::XattrFlags::empty(),
                    XattrFlags::Create => rustix::fs::XattrFlags::CREATE,
                    XattrFlags::Replace => rustix::fs::XattrFlags::REPLACE,
                };
                rustix::fs::lsetxattr(path.as_c_str(), name, value, flags)?
            }
            None => rustix::fs::lremovexattr(path.as_c_str(), name)?,
        }
        // Its ctime moved.
        self.tree.dropped_file(id);
        Ok(())
    }
}
