//! Writes a layer's entries into its staging directory, whatever they come
//! from (a directory walk, a tarball, a registry's blob).
//!
//! Every rule about what a layer keeps is here, once:
//! - a path is taken apart into names and walked one directory at a time
//!   without following symlinks, so no entry lands outside the layer (`..`,
//!   a symlink in the way, an absolute hard-link target are refused);
//! - files, directories, symlinks, hard links and FIFOs are kept as they are;
//!   a whiteout under a non-directory is dropped;
//!   devices only when the store runs as root (its mounts are `nodev`), and
//!   owners likewise; sockets are never part of a layer;
//! - extended attributes are kept by [`xattrs::keeps`];
//! - permission bits and times (to the nanosecond) of a directory are set
//!   once its entries are all written, so neither a read-only directory nor
//!   the entries made in it get in the way;
//! - a file's content digest is taken while it is written, so naming the
//!   layer does not read it again;
//! - nothing is synced one file at a time: [`LayerWriter::finish`] makes the
//!   whole staging filesystem durable once, before the layer is renamed into
//!   place.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustc_hash::FxHashMap;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use crate::digest::Known;
use crate::xattrs::{self, Xattrs};

/// Why an entry could not be written.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Its path, or a hard link's target, leads out of the layer.
    Outside,
    /// Anything else: the cause, in the layer's terms.
    Cannot(io::Error),
}

impl From<io::Error> for Refused {
    fn from(e: io::Error) -> Refused {
        Refused::Cannot(e)
    }
}

impl From<Errno> for Refused {
    fn from(e: Errno) -> Refused {
        Refused::Cannot(e.into())
    }
}

/// What an entry is, with what it holds.
pub(crate) enum Body<'r> {
    Dir,
    File(&'r mut dyn Read),
    /// A file of `size` bytes whose data blocks, `map`'s (offset, length)
    /// in order, `data` holds one after another; the rest is holes, kept
    /// as holes.
    Sparse {
        data: &'r mut dyn Read,
        map: &'r [(u64, u64)],
        size: u64,
    },
    /// A file of `size` bytes whose data comes later (a lazy layer's): all
    /// holes now, its content's SHA-256 given.
    Lazy {
        size: u64,
        content: [u8; 32],
    },
    Symlink(&'r Path),
    /// Another name of a file already written; the path is inside the layer.
    HardLink(&'r Path),
    Fifo,
    CharDevice(u64),
    BlockDevice(u64),
}

/// The metadata an entry keeps. Owners are applied only as root.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meta {
    /// Permission bits, setuid, setgid and sticky included.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: Option<Timespec>,
    pub mtime: Option<Timespec>,
    pub xattrs: Xattrs,
}

/// A layer being written into a staging directory.
pub(crate) struct LayerWriter {
    root: OwnedFd,
    path: PathBuf,
    as_root: bool,
    /// What was written of each regular file, by inode number.
    files: FxHashMap<u64, Known>,
    /// Directories whose permission bits and times are set at the end.
    dirs: Vec<(PathBuf, Meta)>,
    /// The directory the last entry went into: entries come grouped by
    /// directory, so most need no walk.
    last_parent: Option<(PathBuf, OwnedFd)>,
    buf: Vec<u8>,
}

impl LayerWriter {
    pub fn new(staged: &Path) -> io::Result<LayerWriter> {
        let root = rustix::fs::open(
            staged,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(LayerWriter {
            root,
            path: staged.to_path_buf(),
            as_root: rustix::process::geteuid().is_root(),
            files: FxHashMap::default(),
            dirs: Vec::new(),
            last_parent: None,
            buf: vec![0; 256 * 1024],
        })
    }

    /// Whether owners, devices and privileged attributes are kept.
    pub fn as_root(&self) -> bool {
        self.as_root
    }

    /// Writes the entry at `path` (relative to the layer; a leading `/` and
    /// `.` components are ignored). An entry over an earlier one of the same
    /// name replaces it, as a later tar entry does, unless either is a
    /// directory holding the other's place.
    pub fn put(&mut self, path: &Path, body: Body<'_>, meta: &Meta) -> Result<(), Refused> {
        let names = names_of(path)?;
        let Some((name, parents)) = names.split_last() else {
            // The layer's own root.
            if matches!(body, Body::Dir) {
                self.dirs.push((PathBuf::new(), meta.clone()));
                return Ok(());
            }
            return Err(Refused::Cannot(io::Error::other(
                "the layer's root is a directory",
            )));
        };
        let parent = match self.parent(parents, true) {
            // A whiteout under a path its own layer made a non-directory
            // (`umoci repack` of a directory turned into a file): there is
            // nothing under a file to hide. Dropped, as umoci and podman do.
            Err(Refused::Cannot(e))
                if name
                    .as_bytes()
                    .starts_with(crate::WHITEOUT_PREFIX.as_bytes())
                    && e.raw_os_error() == Some(Errno::NOTDIR.raw_os_error()) =>
            {
                tracing::debug!(path = %path.display(), "a whiteout under a non-directory: dropped");
                return Ok(());
            }
            other => other?,
        };
        let done = self.put_in(&parent.1, &names, body, meta);
        self.keep_parent(parent);
        done
    }

    /// [`Self::put`] of the entry `names` into its directory `parent`.
    fn put_in(
        &mut self,
        parent: &OwnedFd,
        names: &[&OsStr],
        body: Body<'_>,
        meta: &Meta,
    ) -> Result<(), Refused> {
        let (&name, parents) = names.split_last().expect("put checked a name");
        match body {
            Body::Dir => {
                match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
                    Err(Errno::EXIST) if is_dir_at(parent, name) => {}
                    Err(Errno::EXIST) => {
                        replace(parent, name)?;
                        rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))?;
                    }
                    other => other?,
                }
                let dir = open_dir_at(parent, name)?;
                self.own(&dir, meta)?;
                self.set_xattrs(&dir, None, meta)?;
                self.dirs.push((names.iter().collect(), meta.clone()));
                return Ok(());
            }
            Body::File(_) | Body::Sparse { .. } | Body::Lazy { .. } => {
                let file = loop {
                    match rustix::fs::openat(
                        parent,
                        name,
                        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
                        permissions(meta.mode) & Mode::RWXU.union(Mode::RWXG).union(Mode::RWXO),
                    ) {
                        Err(Errno::EXIST) => replace(parent, name)?,
                        other => break other?,
                    }
                };
                let content = match body {
                    Body::Sparse { data, map, size } => {
                        self.copy_in_sparse(data, map, size, &file)?
                    }
                    Body::File(data) => self.copy_in(data, &file)?,
                    Body::Lazy { size, content } => {
                        rustix::fs::ftruncate(&file, size)?;
                        content
                    }
                    _ => unreachable!("matched above"),
                };
                // A new file is most often already as wanted (owned by the
                // daemon, its bits left by the umask): no call then.
                let made = rustix::fs::fstat(&file)?;
                if (made.st_uid, made.st_gid) != (meta.uid, meta.gid) {
                    self.own(&file, meta)?;
                }
                if Mode::from_raw_mode(made.st_mode as _) & Mode::from_raw_mode(0o7777)
                    != permissions(meta.mode)
                {
                    rustix::fs::fchmod(&file, permissions(meta.mode))?;
                }
                let ino = made.st_ino;
                let xattrs = self.set_xattrs(&file, None, meta)?;
                self.files.insert(ino, Known { content, xattrs });
                rustix::fs::futimens(&file, &times(meta))?;
                return Ok(());
            }
            Body::Symlink(target) => {
                retry_replacing(parent, name, || {
                    rustix::fs::symlinkat(target.as_os_str(), parent, name)
                })?;
            }
            Body::HardLink(target) => {
                let target_names = names_of_link(target)?;
                let Some((target_name, target_parents)) = target_names.split_last() else {
                    return Err(Refused::Cannot(io::Error::other(
                        "a hard link to the layer's root",
                    )));
                };
                let target_dir = self.parent(target_parents, false)?;
                let linked = retry_replacing(parent, name, || {
                    rustix::fs::linkat(&target_dir.1, *target_name, parent, name, AtFlags::empty())
                });
                self.keep_parent(target_dir);
                linked?;
                // Another name of a file already written keeps its metadata.
                return Ok(());
            }
            Body::Fifo => self.node(parent, name, FileType::Fifo, 0)?,
            Body::CharDevice(rdev) => self.node(parent, name, FileType::CharacterDevice, rdev)?,
            Body::BlockDevice(rdev) => self.node(parent, name, FileType::BlockDevice, rdev)?,
        }
        // A symlink or a node: set through its name, never following it.
        let nofollow = AtFlags::SYMLINK_NOFOLLOW;
        if self.as_root {
            rustix::fs::chownat(parent, name, uid(meta.uid), gid(meta.gid), nofollow)?;
        }
        if !matches!(body, Body::Symlink(_)) {
            rustix::fs::chmodat(parent, name, permissions(meta.mode), AtFlags::empty())?;
        }
        let full = self
            .path
            .join(parents.iter().collect::<PathBuf>())
            .join(name);
        self.set_xattrs(parent, Some(&full), meta)?;
        rustix::fs::utimensat(parent, name, &times(meta), nofollow)?;
        Ok(())
    }

    /// Sets the deferred directory modes and times, then makes everything
    /// written durable with one sync of the staging filesystem. Returns what
    /// was written of each regular file, by inode number.
    /// Makes the directories above `path` that are missing, as a later
    /// [`Self::put`] of it would.
    pub fn make_parents(&mut self, path: &Path) -> Result<(), Refused> {
        let names = names_of(path)?;
        if let Some((_, parents)) = names.split_last() {
            let parent = self.parent(parents, true)?;
            self.keep_parent(parent);
        }
        Ok(())
    }

    /// What was written of each regular file, by inode, for another writer
    /// of the same layer to [`Self::absorb`]: nothing is finished here.
    pub fn into_files(self) -> FxHashMap<u64, Known> {
        self.files
    }

    /// Takes in what another writer of the same layer wrote.
    pub fn absorb(&mut self, files: FxHashMap<u64, Known>) {
        self.files.extend(files);
    }

    pub fn finish(mut self) -> io::Result<FxHashMap<u64, Known>> {
        self.last_parent = None;
        for (path, meta) in std::mem::take(&mut self.dirs) {
            let names = names_of(&path).map_err(refused_to_io)?;
            let dir = match names.split_last() {
                None => self.root.try_clone()?,
                Some((name, parents)) => {
                    let parent = self.parent(parents, false).map_err(refused_to_io)?;
                    let dir = open_dir_at(&parent.1, name)?;
                    self.keep_parent(parent);
                    dir
                }
            };
            rustix::fs::fchmod(&dir, permissions(meta.mode))?;
            rustix::fs::futimens(&dir, &times(&meta))?;
        }
        // The staging filesystem alone on Linux; every one elsewhere.
        #[cfg(target_os = "linux")]
        rustix::fs::syncfs(&self.root)?;
        #[cfg(not(target_os = "linux"))]
        rustix::fs::sync();
        Ok(self.files)
    }

    /// The directory `names` below the root, walked without following
    /// symlinks; missing directories are made when `create` is set.
    /// The directory is taken out of the one-entry cache; [`Self::keep_parent`]
    /// puts it back, so the common case costs no descriptor copy.
    fn parent(&mut self, names: &[&OsStr], create: bool) -> Result<(PathBuf, OwnedFd), Refused> {
        let key: PathBuf = names.iter().collect();
        if let Some((path, fd)) = self.last_parent.take() {
            if path == key {
                return Ok((path, fd));
            }
        }
        let mut dir = self.root.try_clone()?;
        for name in names {
            let next = match open_dir_at(&dir, name) {
                Err(Errno::NOENT) if create => {
                    rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(0o755))?;
                    open_dir_at(&dir, name)
                }
                other => other,
            };
            dir = match next {
                Ok(fd) => fd,
                Err(Errno::LOOP | Errno::NOTDIR) if is_symlink_at(&dir, name) => {
                    return Err(Refused::Outside)
                }
                Err(e) => return Err(e.into()),
            };
        }
        Ok((key, dir))
    }

    /// Caches the directory [`Self::parent`] gave, for the next entry.
    fn keep_parent(&mut self, parent: (PathBuf, OwnedFd)) {
        self.last_parent = Some(parent);
    }

    fn node(&self, dir: &OwnedFd, name: &OsStr, kind: FileType, rdev: u64) -> Result<(), Refused> {
        let device = matches!(kind, FileType::CharacterDevice | FileType::BlockDevice);
        if device && !self.as_root {
            return Err(Refused::Cannot(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "a device node can be kept only by a daemon run as root",
            )));
        }
        retry_replacing(dir, name, || make_node(dir, name, kind, rdev))?;
        Ok(())
    }

    /// Copies `data` into `file`, returning its SHA-256.
    fn copy_in(&mut self, data: &mut dyn Read, file: &OwnedFd) -> io::Result<[u8; 32]> {
        let mut hash = Sha256::new();
        let mut out = std::fs::File::from(file.try_clone()?);
        loop {
            let n = match data.read(&mut self.buf) {
                Ok(0) => return Ok(hash.finalize().into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            hash.update(&self.buf[..n]);
            out.write_all(&self.buf[..n])?;
        }
    }

    /// Writes the data blocks `data` holds where `map` puts them in a file
    /// of `size` bytes, leaving holes between; returns the SHA-256 of the
    /// whole file, holes read as zeros.
    fn copy_in_sparse(
        &mut self,
        data: &mut dyn Read,
        map: &[(u64, u64)],
        size: u64,
        file: &OwnedFd,
    ) -> io::Result<[u8; 32]> {
        use std::os::unix::fs::FileExt;
        let mut hash = Sha256::new();
        let out = std::fs::File::from(file.try_clone()?);
        let mut at = 0;
        for &(offset, len) in map {
            hash_zeros(&mut hash, offset - at);
            let mut written = 0;
            while written < len {
                let want = (len - written).min(self.buf.len() as u64) as usize;
                let n = match data.read(&mut self.buf[..want]) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "a sparse file's data cut short",
                        ))
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                hash.update(&self.buf[..n]);
                out.write_all_at(&self.buf[..n], offset + written)?;
                written += n as u64;
            }
            at = offset + len;
        }
        hash_zeros(&mut hash, size - at);
        out.set_len(size)?;
        Ok(hash.finalize().into())
    }

    fn own(&self, fd: &OwnedFd, meta: &Meta) -> io::Result<()> {
        if self.as_root {
            rustix::fs::fchown(fd, uid(meta.uid), gid(meta.gid))?;
        }
        Ok(())
    }

    /// Sets the attributes a layer keeps: through `fd`, or for a symlink or
    /// node (which cannot be opened to be written) through its full `path`.
    /// Returns those set, sorted by name.
    fn set_xattrs(&self, fd: &OwnedFd, path: Option<&Path>, meta: &Meta) -> io::Result<Xattrs> {
        let mut set_all = Xattrs::new();
        for (name, value) in &meta.xattrs {
            if !xattrs::keeps(name.as_bytes(), self.as_root) {
                continue;
            }
            let set = match path {
                None => rustix::fs::fsetxattr(fd, name.as_os_str(), value, XattrFlags::empty()),
                Some(path) => {
                    rustix::fs::lsetxattr(path, name.as_os_str(), value, XattrFlags::empty())
                }
            };
            match set {
                Ok(()) => set_all.push((name.clone(), value.clone())),
                Err(Errno::NOTSUP) => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "the store's filesystem does not keep the extended attribute {}",
                            name.to_string_lossy()
                        ),
                    ))
                }
                // Linux allows `user.` attributes only on files and
                // directories; a symlink or FIFO carrying one is an image
                // made elsewhere, and the attribute cannot be kept here.
                Err(Errno::PERM) if path.is_some() && name.as_bytes().starts_with(b"user.") => {
                    tracing::warn!(path = %path.unwrap_or(Path::new("")).display(), "{} not kept", name.to_string_lossy());
                }
                Err(e) => {
                    return Err(io::Error::new(
                        io::Error::from(e).kind(),
                        format!("cannot set {}: {e}", name.to_string_lossy()),
                    ))
                }
            }
        }
        // The last value given for a name is the one it has.
        set_all.reverse();
        set_all.sort_by(|a, b| a.0.cmp(&b.0));
        set_all.dedup_by(|later, earlier| later.0 == earlier.0);
        Ok(set_all)
    }
}

/// Hashes `len` zero bytes: a hole, as it reads.
fn hash_zeros(hash: &mut Sha256, mut len: u64) {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    while len > 0 {
        let n = len.min(ZEROS.len() as u64) as usize;
        hash.update(&ZEROS[..n]);
        len -= n as u64;
    }
}

/// The names of an entry's path, inside the layer.
fn names_of(path: &Path) -> Result<Vec<&OsStr>, Refused> {
    let mut names = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(name) => names.push(name),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err(Refused::Outside),
        }
    }
    Ok(names)
}

/// The names of a hard link's target; an absolute target names a file of
/// the host, never of the layer.
fn names_of_link(target: &Path) -> Result<Vec<&OsStr>, Refused> {
    if target.is_absolute() {
        return Err(Refused::Outside);
    }
    names_of(target)
}

fn refused_to_io(r: Refused) -> io::Error {
    match r {
        Refused::Outside => io::Error::other(super::OUTSIDE),
        Refused::Cannot(e) => e,
    }
}

fn open_dir_at(dir: &OwnedFd, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn kind_at(dir: &OwnedFd, name: &OsStr) -> Option<FileType> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .map(|st| FileType::from_raw_mode(st.st_mode))
}

fn is_dir_at(dir: &OwnedFd, name: &OsStr) -> bool {
    kind_at(dir, name) == Some(FileType::Directory)
}

fn is_symlink_at(dir: &OwnedFd, name: &OsStr) -> bool {
    kind_at(dir, name) == Some(FileType::Symlink)
}

/// Removes the non-directory `name` so a later entry can take its place.
fn replace(dir: &OwnedFd, name: &OsStr) -> Result<(), Refused> {
    if is_dir_at(dir, name) {
        return Err(Refused::Cannot(io::Error::other(
            "a directory of that name is already in the layer",
        )));
    }
    rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    Ok(())
}

/// Runs `make`, replacing an entry of the same name once if there is one.
fn retry_replacing(
    dir: &OwnedFd,
    name: &OsStr,
    make: impl Fn() -> rustix::io::Result<()>,
) -> Result<(), Refused> {
    match make() {
        Err(Errno::EXIST) => {
            replace(dir, name)?;
            Ok(make()?)
        }
        other => Ok(other?),
    }
}

#[cfg(not(target_vendor = "apple"))]
fn make_node(dir: &OwnedFd, name: &OsStr, kind: FileType, rdev: u64) -> rustix::io::Result<()> {
    rustix::fs::mknodat(dir, name, kind, Mode::from_raw_mode(0o600), rdev as _)
}

/// rustix has no `mknodat` for Apple's systems; their layers hold no
/// FIFOs or devices.
#[cfg(target_vendor = "apple")]
fn make_node(_: &OwnedFd, _: &OsStr, _: FileType, _: u64) -> rustix::io::Result<()> {
    Err(Errno::NOTSUP)
}

/// The permission bits of `mode`, in the host's width.
fn permissions(mode: u32) -> Mode {
    Mode::from_raw_mode((mode & 0o7777) as _)
}

fn times(meta: &Meta) -> Timestamps {
    const OMIT: Timespec = Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_OMIT,
    };
    let mtime = meta.mtime.unwrap_or(OMIT);
    Timestamps {
        last_access: meta.atime.unwrap_or(mtime),
        last_modification: mtime,
    }
}

fn uid(n: u32) -> Option<rustix::fs::Uid> {
    Some(rustix::fs::Uid::from_raw(n))
}

fn gid(n: u32) -> Option<rustix::fs::Gid> {
    Some(rustix::fs::Gid::from_raw(n))
}
