//! The content digest that names a layer.
//!
//! SHA-256 over a canonical walk of the tree: entries in byte order of their
//! paths, each with its type, permission bits, owner, and either its
//! content's digest, its symlink target or its device number; then the
//! extended attributes a layer keeps, and for a file with several names,
//! the first of them. Times are left out, so the same files imported from a
//! directory or from a tarball get the same id. Attributes and links add to
//! the digest only where a tree has them, so a tree without either keeps
//! the id it had before they were counted.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustc_hash::FxHashMap;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use sha2::{Digest, Sha256};

use crate::xattrs::{self, On, Xattrs};

/// What the writer of a tree already knows of one of its regular files, so
/// the digest need not read it again: its content's SHA-256 and its
/// extended attributes that a layer keeps, sorted by name.
pub(crate) struct Known {
    pub content: [u8; 32],
    pub xattrs: Xattrs,
}

/// The hex SHA-256 digest of the tree under `root` (not following symlinks).
pub fn tree_digest(root: &Path) -> io::Result<String> {
    tree_digest_with(root, &FxHashMap::default())
}

/// [`tree_digest`], taking what `known` holds of a file (by inode number)
/// instead of reading it.
pub(crate) fn tree_digest_with(root: &Path, known: &FxHashMap<u64, Known>) -> io::Result<String> {
    let mut walk = Walk {
        hash: Sha256::new(),
        known,
        first_names: HashMap::new(),
        buf: vec![0; 256 * 1024],
    };
    let fd = open(rustix::fs::CWD, root, OFlags::DIRECTORY)?;
    walk.dir(&fd, root, b"")?;
    Ok(hex(&walk.hash.finalize()))
}

struct Walk<'k> {
    hash: Sha256,
    known: &'k FxHashMap<u64, Known>,
    /// The first path walked of each file with several names.
    first_names: HashMap<u64, Vec<u8>>,
    buf: Vec<u8>,
}

impl Walk<'_> {
    #[allow(clippy::unnecessary_cast)] // stat's field types differ between platforms
    fn dir(&mut self, dir: &OwnedFd, path: &Path, rel: &[u8]) -> io::Result<()> {
        let mut names: Vec<CString> = Vec::new();
        for entry in rustix::fs::Dir::read_from(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if name != c"." && name != c".." {
                names.push(name.to_owned());
            }
        }
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in names {
            let stat = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
            let mut entry_rel = rel.to_vec();
            entry_rel.push(b'/');
            entry_rel.extend_from_slice(name.as_bytes());
            let kind = FileType::from_raw_mode(stat.st_mode);
            let tag: &[u8] = match kind {
                FileType::Directory => b"d",
                FileType::Symlink => b"l",
                FileType::RegularFile => b"f",
                FileType::Fifo => b"p",
                FileType::CharacterDevice => b"c",
                FileType::BlockDevice => b"b",
                _ => b"s",
            };
            // Lengths first, so no two different trees serialise the same.
            self.hash.update((entry_rel.len() as u64).to_be_bytes());
            self.hash.update(&entry_rel);
            self.hash.update(tag);
            self.hash
                .update((stat.st_mode as u32 & 0o7777).to_be_bytes());
            self.hash.update(stat.st_uid.to_be_bytes());
            self.hash.update(stat.st_gid.to_be_bytes());
            let full = path.join(OsStr::from_bytes(name.as_bytes()));
            let mut opened = None;
            let mut read_xattrs = None;
            match kind {
                FileType::RegularFile => match self.known.get(&stat.st_ino) {
                    Some(known) => {
                        self.hash.update(known.content);
                        read_xattrs = Some(known.xattrs.clone());
                    }
                    None => {
                        let file = open(dir, &name, OFlags::empty())?;
                        let content = self.file_digest(&file)?;
                        self.hash.update(content);
                        opened = Some(file);
                    }
                },
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(dir, &name, Vec::new())?;
                    self.hash
                        .update((target.as_bytes().len() as u64).to_be_bytes());
                    self.hash.update(target.as_bytes());
                }
                FileType::CharacterDevice | FileType::BlockDevice => {
                    self.hash.update((stat.st_rdev as u64).to_be_bytes());
                }
                FileType::Directory => opened = Some(open(dir, &name, OFlags::DIRECTORY)?),
                _ => {}
            }
            let on = match &opened {
                Some(fd) => On::Fd(fd.as_fd()),
                None => On::Path(&full),
            };
            let found = match read_xattrs {
                Some(found) => found,
                None => xattrs::read(on, |n| xattrs::keeps(n, true))?,
            };
            if !found.is_empty() {
                self.hash.update(b"x");
                self.hash.update((found.len() as u64).to_be_bytes());
                for (name, value) in &found {
                    self.hash.update((name.len() as u64).to_be_bytes());
                    self.hash.update(name.as_bytes());
                    self.hash.update((value.len() as u64).to_be_bytes());
                    self.hash.update(value);
                }
            }
            if kind != FileType::Directory && stat.st_nlink > 1 {
                let first = self
                    .first_names
                    .entry(stat.st_ino)
                    .or_insert_with(|| entry_rel.clone());
                if *first != entry_rel {
                    self.hash.update(b"h");
                    self.hash.update((first.len() as u64).to_be_bytes());
                    self.hash.update(&first[..]);
                }
            }
            if let (FileType::Directory, Some(sub)) = (kind, &opened) {
                self.dir(sub, &full, &entry_rel)?;
                self.hash.update(b"end");
            }
        }
        Ok(())
    }

    fn file_digest(&mut self, file: &OwnedFd) -> io::Result<[u8; 32]> {
        let mut file = std::fs::File::from(file.try_clone()?);
        let mut hash = Sha256::new();
        loop {
            match file.read(&mut self.buf)? {
                0 => return Ok(hash.finalize().into()),
                n => hash.update(&self.buf[..n]),
            }
        }
    }
}

/// Opens `name` in `dir` for reading, never through a symlink; `kind` adds
/// `DIRECTORY` where a directory is wanted.
pub(crate) fn open<P: rustix::path::Arg>(
    dir: impl AsFd,
    name: P,
    kind: OFlags,
) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | kind,
        Mode::empty(),
    )?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
