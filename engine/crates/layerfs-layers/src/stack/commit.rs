//! Commit: the upper becomes the top read-only layer holding what the
//! workspace held at one moment, and the workspace goes on over a new,
//! empty upper.
//!
//! Changes through the filesystem wait for the commit (it holds the
//! stack's write lock). A file that a descriptor may still change without
//! asking the filesystem (a FUSE passthrough open: the kernel writes the
//! host file itself) cannot be made to wait, so it is not left in the
//! layer: the file itself (its inode, which every such descriptor follows)
//! moves to the new upper under its identity, and the layer gets a copy
//! taken during the commit. Files the NFS client keeps for a file removed
//! while open (`.nfs…`) move too, with no copy: they are not part of the
//! workspace's contents.
//!
//! Order, and what a crash between two steps leaves:
//! 1. the journal (`commit.journal` in the state directory) names the new
//!    upper and each moving path, durably;
//! 2. each moving file gets a second name in the new upper (a hard link),
//!    its copy is made in the work directory, and the identities it keeps
//!    are recorded;
//! 3. the upper's filesystem is synced, and `persist` records the new stack;
//! 4. in the committed layer each copy replaces its file (debris is
//!    removed), and the journal goes.
//!
//! Before 3, the recorded stack is the old one, whose upper still holds
//! every file; the journal is dropped at the next open. After 3, the
//! committed layer may still share files with the new upper: the next open
//! does step 4 from the journal before anything is served.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerfs_vfs::hostdir::{self, cstr, Host};
use layerfs_vfs::{Error, FileId, FileKind, Result};
use rustix::fs::{AtFlags, Mode};

use super::copy_up::{copy_data, copy_owner_mode_times};
use super::merge::{Layers, UPPER};
use super::whiteouts::is_hidden;
use super::{open_root, StackFs};

/// The journal's name in the state directory.
const JOURNAL: &str = "commit.journal";

/// A file the commit takes out of the upper: its path below the upper's
/// root, and whether the committed layer keeps a copy of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Moving {
    path: Vec<Vec<u8>>,
    copy: bool,
}

/// Whether `name` is one the NFS client gives a file removed while a
/// process holds it open: Linux `.nfs` and 24 hex digits, macOS
/// `.nfs.` 8 hex digits `.` 4 hex digits.
pub fn is_client_debris(name: &[u8]) -> bool {
    let hex = |s: &[u8]| s.iter().all(u8::is_ascii_hexdigit);
    match name.strip_prefix(b".nfs") {
        Some(rest) if rest.len() == 24 => hex(rest),
        Some([b'.', rest @ ..]) if rest.len() == 13 && rest[8] == b'.' => {
            hex(&rest[..8]) && hex(&rest[9..])
        }
        _ => false,
    }
}

impl StackFs {
    /// Turns the upper into the top read-only layer and continues on the
    /// empty directory `new_upper` (on the same filesystem), keeping every
    /// id and handle. `written_directly` names the files a descriptor may
    /// write without asking this filesystem (see the module's text). Changes
    /// wait meanwhile. The upper is made durable, then `persist` is called
    /// with the new stack (bottom first) to record it; only once that
    /// succeeds does the stack change, so an error leaves the old stack
    /// whole, and a crash leaves one of the two.
    pub fn commit_upper(
        &self,
        new_upper: &Path,
        written_directly: &[FileId],
        persist: impl FnOnce(&[PathBuf]) -> Result<()>,
    ) -> Result<()> {
        let mut current = self.tree.write_layers();
        let _ns = self.upper.lock_ns();
        // Copy-ups' records and entries, so the layer is named by what lasts.
        self.make_durable()?;
        std::fs::create_dir_all(new_upper)?;
        let new_path = new_upper.canonicalize()?;
        if std::fs::read_dir(&new_path)?.next().is_some() {
            return Err(Error::NotEmpty);
        }
        let mut paths = self.tree.paths.lock().clone();
        paths.insert(0, new_path.clone());
        let next = Self::layers_at(&self.tree.inodes, &paths, current.generation + 1)?;
        if rustix::fs::fstat(&*next.all[UPPER].root)?.st_dev
            != rustix::fs::fstat(&self.upper.work)?.st_dev
        {
            return Err(Error::XDev);
        }
        let moving = self.moving(&current, written_directly)?;
        let copies = match self.prepare(&current, &next, &new_path, &moving) {
            Ok(copies) => copies,
            Err(e) => {
                self.undo(&new_path);
                return Err(e);
            }
        };
        let mut bottom_first = paths.clone();
        bottom_first.reverse();
        let recorded = hostdir::sync_filesystem(current.all[UPPER].root.as_fd())
            .and_then(|()| persist(&bottom_first));
        if let Err(e) = recorded {
            self.undo(&new_path);
            return Err(e);
        }
        let committed = current.all[UPPER].root.clone();
        *current = Arc::new(next);
        *self.tree.paths.lock() = paths;
        self.tree.caches.layers_changed();
        // The new upper holds nothing yet.
        self.upper.quota.freed();
        // The new stack is recorded: from here on a crash is finished by the
        // next open, from the journal.
        finish_in(self.upper.work.as_fd(), committed.as_fd(), &moving, &copies)?;
        self.drop_journal()
    }

    /// The files the commit moves: the upper files of `written_directly`,
    /// and the NFS client's debris.
    fn moving(&self, layers: &Layers, written_directly: &[FileId]) -> Result<Vec<Moving>> {
        let mut inodes = HashSet::new();
        for &id in written_directly {
            // A file gone since (removed while open) is in no layer.
            if let Ok(f) = self.tree.found(layers, id) {
                if f.layer == UPPER && f.kind() == FileKind::Regular {
                    inodes.insert(f.host.fileid);
                }
            }
        }
        let mut out = Vec::new();
        let root = layers.all[UPPER].root.clone();
        walk(
            &layers.all[UPPER].host,
            root.as_fd(),
            &mut Vec::new(),
            &mut |path, ino| {
                let name = path.last().expect("a path has a name");
                if inodes.contains(&ino) {
                    out.push(Moving {
                        path: path.to_vec(),
                        copy: true,
                    });
                } else if is_client_debris(name) {
                    out.push(Moving {
                        path: path.to_vec(),
                        copy: false,
                    });
                }
            },
        )?;
        Ok(out)
    }

    /// Steps 1 and 2: the journal, the links in the new upper, the copies
    /// and the moved files' identities there. Returns the copies' names in
    /// the work directory, by index into `moving`.
    fn prepare(
        &self,
        current: &Layers,
        next: &Layers,
        new_path: &Path,
        moving: &[Moving],
    ) -> Result<Vec<Option<CString>>> {
        if moving.is_empty() {
            return Ok(Vec::new());
        }
        self.write_journal(new_path, moving)?;
        let old = &current.all[UPPER];
        let new = &next.all[UPPER];
        let mut origins = Vec::new();
        for m in moving {
            let (old_dir, name) = open_parent(old.root.as_fd(), &m.path)?;
            let new_dir = make_parents(&old.host, old.root.as_fd(), new.root.as_fd(), &m.path)?;
            // Directories keep their modes: a read-only one is lent its
            // owner's write permission where the server is not root.
            hostdir::lending_write(&[new_dir.as_fd()], || {
                Ok(rustix::fs::linkat(
                    &old_dir,
                    &name,
                    &new_dir,
                    &name,
                    AtFlags::empty(),
                )?)
            })?;
            let host = old.host.stats.at(old_dir.as_fd(), &*name)?;
            let shown = self.tree.shown(current, UPPER, host)?;
            let origin = super::inodes::Origin {
                id: shown.fileid,
                generation: shown.generation,
            };
            origins.push((new.tag, host.fileid, host.generation, origin));
        }
        let mut n = 0;
        let copies = stage_copies(
            &old.host,
            self.upper.work.as_fd(),
            old.root.as_fd(),
            moving,
            || {
                n += 1;
                format!("commit-{n}")
            },
        )?;
        self.tree.inodes.record(&origins)?;
        Ok(copies)
    }

    /// Takes back a commit that failed before its stack was recorded: the
    /// new upper and the copies go (the old upper still holds every file).
    fn undo(&self, new_path: &Path) {
        if let Err(e) = crate::remove_tree(new_path) {
            tracing::warn!("{}: {e}", new_path.display());
        }
        for (name, _, _) in hostdir::list(self.upper.work.as_fd()).unwrap_or_default() {
            if name.starts_with(b"commit-") {
                if let Ok(name) = cstr(&name) {
                    let _ = rustix::fs::unlinkat(&self.upper.work, &name, AtFlags::empty());
                }
            }
        }
        let _ = self.drop_journal();
    }

    fn write_journal(&self, new_path: &Path, moving: &[Moving]) -> Result<()> {
        let mut text = new_path.as_os_str().as_encoded_bytes().to_vec();
        text.push(0);
        for m in moving {
            text.push(if m.copy { b'c' } else { b'd' });
            text.extend_from_slice(&m.path.join(&b'/'));
            text.push(0);
        }
        let aside = self.upper.state.join(format!("{JOURNAL}.new"));
        let mut file = std::fs::File::create(&aside)?;
        file.write_all(&text)?;
        file.sync_all()?;
        std::fs::rename(&aside, self.upper.state.join(JOURNAL))?;
        std::fs::File::open(&self.upper.state)?.sync_all()?;
        Ok(())
    }

    fn drop_journal(&self) -> Result<()> {
        match std::fs::remove_file(self.upper.state.join(JOURNAL)) {
            Ok(()) => Ok(std::fs::File::open(&self.upper.state)?.sync_all()?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Finishes a commit a crash cut short (step 4), before a stack over `upper`
/// with `committed` as its top layer is served; drops the journal of one
/// whose stack was never recorded. `work` is an empty scratch directory.
pub(super) fn recover(
    state: &Path,
    upper: &Path,
    committed: Option<&Path>,
    work: BorrowedFd<'_>,
) -> Result<()> {
    let journal = state.join(JOURNAL);
    let text = match std::fs::read(&journal) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut records = text.split(|&b| b == 0).filter(|r| !r.is_empty());
    let journal_upper = records.next().unwrap_or_default();
    if let (true, Some(committed)) = (
        journal_upper == upper.as_os_str().as_encoded_bytes(),
        committed,
    ) {
        let moving: Vec<Moving> = records
            .filter_map(|r| {
                let (&kind, path) = r.split_first()?;
                Some(Moving {
                    path: path.split(|&b| b == b'/').map(<[u8]>::to_vec).collect(),
                    copy: kind == b'c',
                })
            })
            .collect();
        let new_root = open_root(upper)?;
        let old_root = open_root(committed)?;
        let host = Host::for_dir(new_root.as_fd());
        // Only the files still shared: the others were finished before the crash.
        let shared: Vec<Moving> = moving
            .into_iter()
            .filter(|m| same_file(old_root.as_fd(), new_root.as_fd(), &m.path))
            .collect();
        let mut n = 0;
        let copies = stage_copies(&host, work, new_root.as_fd(), &shared, || {
            n += 1;
            format!("recover-{n}")
        })?;
        hostdir::sync_all(work)?;
        finish_in(work, old_root.as_fd(), &shared, &copies)?;
        tracing::info!(
            "finished a commit a crash cut short: {} files",
            shared.len()
        );
    }
    std::fs::remove_file(&journal)?;
    std::fs::File::open(state)?.sync_all()?;
    Ok(())
}

/// Whether `path` names one file below both roots.
fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>, path: &[Vec<u8>]) -> bool {
    let ino = |root| -> Option<(u64, u64)> {
        let (dir, name) = open_parent(root, path).ok()?;
        let s = rustix::fs::statat(&dir, &*name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        Some((s.st_dev as u64, s.st_ino as u64))
    };
    matches!((ino(a), ino(b)), (Some(x), Some(y)) if x == y)
}

/// Copies into `work` every moving file that keeps a copy, from below
/// `root`: names of one file get one copy, linked as often. The copies
/// are durable once their filesystem is synced.
fn stage_copies(
    host: &Host,
    work: BorrowedFd<'_>,
    root: BorrowedFd<'_>,
    moving: &[Moving],
    mut fresh: impl FnMut() -> String,
) -> Result<Vec<Option<CString>>> {
    let mut by_inode: HashMap<u64, CString> = HashMap::new();
    let mut copies = Vec::with_capacity(moving.len());
    for m in moving {
        if !m.copy {
            copies.push(None);
            continue;
        }
        let (dir, name) = open_parent(root, &m.path)?;
        let like = host.stats.at(dir.as_fd(), &*name)?;
        let tmp = cstr(fresh().as_bytes())?;
        match by_inode.get(&like.fileid) {
            Some(first) => rustix::fs::linkat(work, first, work, &tmp, AtFlags::empty())?,
            None => {
                let src = hostdir::open_regular(dir.as_fd(), &name, rustix::fs::OFlags::RDONLY)?;
                let dst = rustix::fs::openat(
                    work,
                    &tmp,
                    rustix::fs::OFlags::CREATE
                        | rustix::fs::OFlags::EXCL
                        | rustix::fs::OFlags::WRONLY
                        | rustix::fs::OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                copy_data(src, &dst)?;
                copy_owner_mode_times(host, work, &tmp, &like)?;
                by_inode.insert(like.fileid, tmp.clone());
            }
        }
        copies.push(Some(tmp));
    }
    Ok(copies)
}

/// Step 4 in the committed layer below `committed`: each copy (staged in
/// `work`) replaces its file, debris is removed, each directory touched is
/// synced.
fn finish_in(
    work: BorrowedFd<'_>,
    committed: BorrowedFd<'_>,
    moving: &[Moving],
    copies: &[Option<CString>],
) -> Result<()> {
    for (m, copy) in moving.iter().zip(copies) {
        let (dir, name) = open_parent(committed, &m.path)?;
        hostdir::lending_write(&[dir.as_fd()], || match copy {
            Some(tmp) => Ok(rustix::fs::renameat(work, tmp, &dir, &*name)?),
            None => Ok(rustix::fs::unlinkat(&dir, &*name, AtFlags::empty())?),
        })?;
        hostdir::sync_all(dir.as_fd())?;
    }
    Ok(())
}

/// Calls `each` with the path and inode number of every file below `dir`
/// that is not a directory; whiteouts, markers and the state directory are
/// passed over.
fn walk(
    host: &Host,
    dir: BorrowedFd<'_>,
    path: &mut Vec<Vec<u8>>,
    each: &mut dyn FnMut(&[Vec<u8>], u64),
) -> Result<()> {
    for (name, ino, is_dir) in hostdir::list(dir)? {
        if is_hidden(&name) {
            continue;
        }
        path.push(name);
        let name = path.last().expect("just pushed");
        if is_dir {
            let sub = hostdir::open_dir(dir, &cstr(name)?)?;
            walk(host, sub.as_fd(), path, each)?;
        } else {
            let attr = host.stats.at(dir, &*cstr(name)?)?;
            if attr.kind == FileKind::Regular {
                each(path, ino);
            }
        }
        path.pop();
    }
    Ok(())
}

/// The directory holding `path` below `root`, and the path's last name.
fn open_parent(root: BorrowedFd<'_>, path: &[Vec<u8>]) -> Result<(OwnedFd, CString)> {
    let (name, parents) = path.split_last().ok_or(Error::Inval)?;
    let mut dir = rustix::io::dup(root)?;
    for p in parents {
        dir = hostdir::open_dir(dir.as_fd(), &cstr(p)?)?;
    }
    Ok((dir, cstr(name)?))
}

/// The directory in `new_root` that is to hold `path`, made where missing
/// with the mode, owner and times of its counterpart below `old_root`.
fn make_parents(
    host: &Host,
    old_root: BorrowedFd<'_>,
    new_root: BorrowedFd<'_>,
    path: &[Vec<u8>],
) -> Result<OwnedFd> {
    let mut old = rustix::io::dup(old_root)?;
    let mut new = rustix::io::dup(new_root)?;
    for p in &path[..path.len().saturating_sub(1)] {
        let name = cstr(p)?;
        old = hostdir::open_dir(old.as_fd(), &name)?;
        match rustix::fs::mkdirat(&new, &name, Mode::from_raw_mode(0o700)) {
            Ok(()) => {
                let like = host.stats.fd(old.as_fd())?;
                copy_owner_mode_times(host, new.as_fd(), &name, &like)?;
            }
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        new = hostdir::open_dir(new.as_fd(), &name)?;
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nfs_clients_names_for_files_removed_while_open_are_known() {
        assert!(is_client_debris(b".nfs00000000000012340000000a"));
        assert!(is_client_debris(b".nfs.0000beef.00a1"));
        for other in [
            &b".nfs"[..],
            b".nfsrc",
            b".nfs00000000000012340000000",
            b".nfs00000000000012340000000g",
            b".nfs.0000beef-00a1",
            b"x.nfs00000000000012340000000a",
        ] {
            assert!(
                !is_client_debris(other),
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }
}
