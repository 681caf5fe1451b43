//! A layer from a directory tree of the host: every entry as it is, hard
//! links as links, extended attributes and times included. The walk goes
//! from descriptor to descriptor, never through a whole path again.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, OFlags, Stat, Timespec};

use super::writer::{Body, LayerWriter, Meta, Refused};
use super::Copied;
use crate::digest::open;
use crate::xattrs::{self, On};

/// Copies the tree under `src` into `layer`, telling `copied` the file bytes.
pub(super) fn copy_tree(
    src: &Path,
    layer: &mut LayerWriter,
    copied: &mut Copied<'_>,
) -> io::Result<()> {
    let root = open(rustix::fs::CWD, src, OFlags::DIRECTORY).map_err(|e| named(src, e))?;
    let mut walk = Walk {
        layer,
        copied,
        links: HashMap::new(),
    };
    let stat = rustix::fs::fstat(&root)?;
    let meta = walk.meta_of(&stat, On::Fd(root.as_fd()), src)?;
    walk.put(src, Path::new(""), Body::Dir, &meta)?;
    walk.dir(&root, src, Path::new(""))
}

/// The bytes of the regular files under `dir`, for telling progress.
pub(super) fn file_bytes(dir: &Path) -> io::Result<u64> {
    fn under(dir: &OwnedFd) -> io::Result<u64> {
        let mut total = 0;
        for name in names(dir)? {
            let stat = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => total += under(&open(dir, &name, OFlags::DIRECTORY)?)?,
                FileType::RegularFile => total += stat.st_size as u64,
                _ => {}
            }
        }
        Ok(total)
    }
    under(&open(rustix::fs::CWD, dir, OFlags::DIRECTORY)?)
}

struct Walk<'w, 'c> {
    layer: &'w mut LayerWriter,
    copied: &'w mut Copied<'c>,
    /// The first path of each file with more than one name, by device and
    /// inode: its other names become hard links to it.
    links: HashMap<(u64, u64), PathBuf>,
}

impl Walk<'_, '_> {
    #[allow(clippy::unnecessary_cast)] // stat's field types differ between platforms
    fn dir(&mut self, dir: &OwnedFd, path: &Path, rel: &Path) -> io::Result<()> {
        for name in names(dir).map_err(|e| named(path, e))? {
            let os_name = std::ffi::OsStr::from_bytes(name.to_bytes());
            let from = path.join(os_name);
            let to = rel.join(os_name);
            let stat = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| named(&from, e.into()))?;
            let kind = FileType::from_raw_mode(stat.st_mode);
            if kind == FileType::Socket {
                tracing::warn!(path = %from.display(), "a socket is not part of a layer: skipped");
                continue;
            }
            if kind != FileType::Directory && stat.st_nlink > 1 {
                let key = (stat.st_dev as u64, stat.st_ino);
                if let Some(first) = self.links.get(&key) {
                    let first = first.clone();
                    self.put(&from, &to, Body::HardLink(&first), &Meta::default())?;
                    continue;
                }
                self.links.insert(key, to.clone());
            }
            match kind {
                FileType::Directory => {
                    let sub = open(dir, &name, OFlags::DIRECTORY).map_err(|e| named(&from, e))?;
                    let meta = self.meta_of(&stat, On::Fd(sub.as_fd()), &from)?;
                    self.put(&from, &to, Body::Dir, &meta)?;
                    self.dir(&sub, &from, &to)?;
                }
                FileType::RegularFile => {
                    let file = open(dir, &name, OFlags::empty()).map_err(|e| named(&from, e))?;
                    let meta = self.meta_of(&stat, On::Fd(file.as_fd()), &from)?;
                    let mut counted = super::Counted {
                        inner: std::fs::File::from(file),
                        copied: &mut *self.copied,
                    };
                    put(self.layer, &from, &to, Body::File(&mut counted), &meta)?;
                }
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(dir, &name, Vec::new())
                        .map_err(|e| named(&from, e.into()))?;
                    let target =
                        Path::new(std::ffi::OsStr::from_bytes(target.to_bytes())).to_path_buf();
                    let meta = self.meta_of(&stat, On::Path(&from), &from)?;
                    self.put(&from, &to, Body::Symlink(&target), &meta)?;
                }
                FileType::Fifo | FileType::CharacterDevice | FileType::BlockDevice => {
                    let meta = self.meta_of(&stat, On::Path(&from), &from)?;
                    let body = match kind {
                        FileType::Fifo => Body::Fifo,
                        FileType::CharacterDevice => Body::CharDevice(stat.st_rdev as u64),
                        _ => Body::BlockDevice(stat.st_rdev as u64),
                    };
                    self.put(&from, &to, body, &meta)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn put(&mut self, from: &Path, to: &Path, body: Body<'_>, meta: &Meta) -> io::Result<()> {
        put(self.layer, from, to, body, meta)
    }

    #[allow(clippy::unnecessary_cast)] // stat's field types differ between platforms
    fn meta_of(&self, stat: &Stat, on: On<'_>, path: &Path) -> io::Result<Meta> {
        let as_root = self.layer.as_root();
        Ok(Meta {
            mode: stat.st_mode as u32 & 0o7777,
            uid: stat.st_uid,
            gid: stat.st_gid,
            atime: Some(Timespec {
                tv_sec: stat.st_atime,
                tv_nsec: stat.st_atime_nsec as _,
            }),
            mtime: Some(Timespec {
                tv_sec: stat.st_mtime,
                tv_nsec: stat.st_mtime_nsec as _,
            }),
            xattrs: xattrs::read(on, |n| xattrs::keeps(n, as_root)).map_err(|e| named(path, e))?,
        })
    }
}

/// The names in the directory `dir`, without `.` and `..`.
fn names(dir: &OwnedFd) -> io::Result<Vec<std::ffi::CString>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

fn put(
    layer: &mut LayerWriter,
    from: &Path,
    to: &Path,
    body: Body<'_>,
    meta: &Meta,
) -> io::Result<()> {
    layer.put(to, body, meta).map_err(|r| match r {
        Refused::Outside => named(from, io::Error::other(super::OUTSIDE)),
        Refused::Cannot(e) => named(from, e),
    })
}

fn named(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
