//! Files of a lazy layer's tree on the host: found by their paths in the
//! layer, never through a symlink, and the lazy files of a tree just written.

use std::collections::hash_map::Entry as MapEntry;
use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use rustc_hash::FxHashMap;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::{Entry, EntryKind, LazyFile, PERMISSIONS};

pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The names of `path` in the layer: `..` refused.
fn names_of(path: &str) -> io::Result<Vec<&OsStr>> {
    let mut names = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(name) => names.push(name),
            Component::CurDir | Component::RootDir => {}
            _ => return Err(io::Error::other(format!("{path}: leads out of the layer"))),
        }
    }
    Ok(names)
}

/// Directories of a layer walked to, one at a time, never through a
/// symlink; the last one is kept, since files come grouped by directory.
pub(super) struct Dirs {
    root: OwnedFd,
    last: Option<(Vec<u8>, OwnedFd)>,
}

impl Dirs {
    pub(super) fn new(root: &Path) -> io::Result<Dirs> {
        Ok(Dirs {
            root: open_dir(root)?,
            last: None,
        })
    }

    /// The directory holding `path` and its last name.
    pub(super) fn parent<'p>(&mut self, path: &'p str) -> io::Result<(&OwnedFd, &'p OsStr)> {
        let names = names_of(path)?;
        let Some((name, dirs)) = names.split_last() else {
            return Err(io::Error::other("the layer's root is not a file"));
        };
        let key = dirs.iter().fold(Vec::new(), |mut k, d| {
            k.extend_from_slice(d.as_bytes());
            k.push(b'/');
            k
        });
        if self.last.as_ref().is_none_or(|(k, _)| *k != key) {
            let mut dir = self.root.try_clone()?;
            for d in dirs {
                dir = rustix::fs::openat(
                    &dir,
                    *d,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
            }
            self.last = Some((key, dir));
        }
        Ok((&self.last.as_ref().expect("just set").1, name))
    }

    /// Opens the file at `path`, not following a symlink.
    pub(super) fn open(&mut self, path: &str, flags: OFlags) -> io::Result<OwnedFd> {
        let (dir, name) = self.parent(path)?;
        Ok(rustix::fs::openat(
            dir,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// The status of the entry at `path`, not following a symlink.
    pub(super) fn stat(&mut self, path: &str) -> io::Result<rustix::fs::Stat> {
        let (dir, name) = self.parent(path)?;
        Ok(rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
    }
}

/// `path` as the index keeps it: UTF-8, or refused.
pub(crate) fn utf8_path(path: &Path) -> io::Result<&str> {
    std::str::from_utf8(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other(format!("{}: a name that is not UTF-8", path.display())))
}

/// The lazy files of a tree just written: each regular file once (the last
/// entry of a path wins, as it did in the tree; a second name of a file is
/// not a second file), dropping those no longer there.
pub(crate) fn files_in(root: &Path, entries: &[Entry]) -> io::Result<Vec<LazyFile>> {
    let mut dirs = Dirs::new(root)?;
    let mut seen = FxHashMap::default();
    let mut files = Vec::new();
    for entry in entries.iter().rev() {
        let EntryKind::File { pieces, size, .. } = &entry.kind else {
            continue;
        };
        let path = utf8_path(&entry.path)?;
        let Ok(stat) = dirs.stat(path) else {
            continue;
        };
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
            || stat.st_size as u64 != *size
        {
            continue;
        }
        if let MapEntry::Vacant(v) = seen.entry(stat.st_ino) {
            v.insert(());
            if !pieces.is_empty() {
                #[allow(clippy::unnecessary_cast)] // mode_t differs between platforms
                let mode = stat.st_mode as u32 & PERMISSIONS;
                files.push(LazyFile {
                    path: path.to_string(),
                    pieces: pieces.clone(),
                    mode: Some(mode),
                });
            }
        }
    }
    files.reverse();
    Ok(files)
}
