//! Reset: throwing away what the workspace changed, all of it or under
//! given paths, while it is served.
//!
//! What the upper holds at a path (its entry, with everything under it)
//! and the whiteout that hides the path below are removed, so the layers
//! show there again. Files only the upper held are gone (their handles are
//! STALE, an open descriptor keeps its file as after an unlink); a file
//! copied up reverts to the layers' under the same id, with the layers'
//! attributes, which is how an NFS client sees that it changed. A door
//! that caches names and pages (FUSE) is told which to drop:
//! [`ResetDone`].

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use layerfs_vfs::hostdir::{self, cstr};
use layerfs_vfs::{Error, FileId, FileKind, Result};
use rustix::fs::{AtFlags, Mode};

use super::inodes::ROOT;
use super::merge::{Layers, Part, UPPER};
use super::whiteouts::{is_hidden, whiteout_name};
use super::StackFs;

/// What a reset changed, for a door's caches: names whose entry changed
/// (a parent's id and the name), and files and directories whose
/// attributes or data changed.
#[derive(Debug, Default)]
pub struct ResetDone {
    pub names: Vec<(FileId, Vec<u8>)>,
    pub files: Vec<FileId>,
    /// The directories whose entries changed, by their names from the
    /// root (`[]` for the root), each once: what a door that cannot tell
    /// the kernel's caches directly (NFS) makes its clients look at again.
    pub dirs_changed: Vec<Vec<Vec<u8>>>,
    /// Upper directories moved aside into the work directory, removed
    /// once the reset is over.
    discarded: Vec<CString>,
    /// The upper directories whose entries the reset changed, by inode
    /// number: synced at its end.
    dirs: Vec<(u64, OwnedFd)>,
}

impl ResetDone {
    fn changed_path(&mut self, path: &[Vec<u8>]) {
        if !self.dirs_changed.iter().any(|p| p == path) {
            self.dirs_changed.push(path.to_vec());
        }
    }

    fn changed_dir(&mut self, dir: BorrowedFd<'_>) -> Result<()> {
        let ino = rustix::fs::fstat(dir)?.st_ino;
        if !self.dirs.iter().any(|(i, _)| *i == ino) {
            self.dirs.push((ino, dir.try_clone_to_owned()?));
        }
        Ok(())
    }
}

/// Numbers the directories a reset moves aside (the work directory is
/// emptied at each open, so unique within one run is enough).
static DISCARDED: AtomicU64 = AtomicU64::new(0);

impl StackFs {
    /// Throws away the changes under each of `paths` (names from the root,
    /// `[]` for all), taken one moment: changes wait meanwhile. A path the
    /// upper holds nothing of is no error.
    pub fn reset(&self, paths: &[Vec<Vec<u8>>]) -> Result<ResetDone> {
        let mut current = self.tree.write_layers();
        let _ns = self.upper.lock_ns();
        let mut done = ResetDone::default();
        let all = [Vec::new()];
        let paths = if paths.is_empty() { &all[..] } else { paths };
        for path in paths {
            if path
                .iter()
                .any(|n| n.is_empty() || n == b"." || n == b".." || n.contains(&b'/'))
            {
                return Err(Error::Inval);
            }
            self.reset_path(&current, path, &mut done)?;
        }
        // The upper's root may have lost its opaque marker, and every kept
        // part, listing and descriptor may name what is gone.
        let paths = self.tree.paths.lock().clone();
        *current = Arc::new(Self::layers_at(
            &self.tree.inodes,
            &paths,
            current.generation + 1,
        )?);
        self.tree.caches.layers_changed();
        self.upper.quota.freed();
        // Durable before the answer: the directories whose entries changed
        // (not the filesystem, whose sync would write out the data of
        // every file just written, the discarded ones too).
        for (_, dir) in &done.dirs {
            rustix::fs::fsync(dir)?;
        }
        self.remove_discarded(std::mem::take(&mut done.discarded));
        Ok(done)
    }

    /// Moves the upper directory `name` of `upper` aside into the work
    /// directory: one rename where removing it is a call per entry, which
    /// for thousands of files is most of a reset's time.
    fn discard_dir(&self, upper: BorrowedFd<'_>, name: &CStr, done: &mut ResetDone) -> Result<()> {
        let aside = CString::new(format!("reset-{}", DISCARDED.fetch_add(1, Relaxed)))
            .expect("no NUL in a number");
        let set_aside = || match rustix::fs::renameat(upper, name, &self.upper.work, &*aside) {
            Ok(()) => Ok(true),
            // A state directory on another filesystem: removed in place.
            Err(rustix::io::Errno::XDEV) => Ok(false),
            Err(e) => Err(e.into()),
        };
        let set_aside = match set_aside() {
            // Moved to another parent, a read-only directory is lent its
            // owner's write permission, as is a read-only `upper`.
            Err(Error::Access) => {
                let moved = hostdir::open_dir(upper, name)?;
                hostdir::lending_write(&[upper, moved.as_fd()], set_aside)?
            }
            done => done?,
        };
        match set_aside {
            true => done.discarded.push(aside),
            false => remove_tree_at(upper, name)?,
        }
        Ok(())
    }

    /// Removes what a reset moved aside, on a thread of its own: the
    /// reset is durable already (what is aside is in no tree), and a crash
    /// meanwhile leaves it in the work directory, which the next open
    /// empties.
    fn remove_discarded(&self, names: Vec<CString>) {
        if names.is_empty() {
            return;
        }
        let Ok(work) = self.upper.work.try_clone() else {
            return;
        };
        let remove = move || {
            for name in names {
                if let Err(e) = remove_tree_at(work.as_fd(), &name) {
                    tracing::warn!("cannot remove what a reset set aside: {e}");
                }
            }
        };
        let spawned = std::thread::Builder::new()
            .name("layerfs-reset".into())
            .spawn(remove);
        if spawned.is_err() {
            tracing::warn!("no thread to remove what a reset set aside: it goes at the next open");
        }
    }

    fn reset_path(&self, layers: &Layers, path: &[Vec<u8>], done: &mut ResetDone) -> Result<()> {
        // The merged directory holding the path, and its id, walked down.
        let mut parts = layers.root_parts.clone();
        let mut dir = ROOT;
        let Some((last, parents)) = path.split_last() else {
            // The root: everything the upper holds in it.
            let upper = layers.all[UPPER].root.clone();
            done.files.push(ROOT);
            let root = Here {
                dir: ROOT,
                path: &[],
            };
            return self.clear_upper_dir(layers, upper.as_fd(), &root, &parts, done);
        };
        for name in parents {
            let Some(f) = layers.lookup(&self.tree.inodes, &parts, &cstr(name)?)? else {
                return Ok(());
            };
            if f.kind() != FileKind::Directory {
                return Ok(());
            }
            dir = f.attr.fileid;
            parts = f.parts;
        }
        let Some(upper) = parts.first().filter(|p| p.layer == UPPER).cloned() else {
            // No upper part here: nothing was changed under the path.
            return Ok(());
        };
        let here = Here { dir, path: parents };
        self.remove_from_upper(layers, upper.fd.as_fd(), &here, &parts, last, done)
    }

    /// Removes everything the upper directory `upper` (the top of `parts`,
    /// merged directory `here`) holds but the directory itself.
    fn clear_upper_dir(
        &self,
        layers: &Layers,
        upper: BorrowedFd<'_>,
        here: &Here<'_>,
        parts: &[Part],
        done: &mut ResetDone,
    ) -> Result<()> {
        for (name, _, _) in hostdir::list(upper)? {
            if name.starts_with(super::STATE_IN_UPPER.as_bytes()) {
                continue;
            }
            match name.strip_prefix(b".wh.") {
                Some(b".wh..opq") => {
                    let marker = cstr(&name)?;
                    hostdir::lending_write(&[upper], || {
                        Ok(rustix::fs::unlinkat(upper, &marker, AtFlags::empty())?)
                    })?;
                    done.changed_dir(upper)?;
                    done.changed_path(here.path);
                }
                Some(hidden) if !is_hidden(hidden) => {
                    let hidden = hidden.to_vec();
                    self.remove_from_upper(layers, upper, here, parts, &hidden, done)?
                }
                Some(_) => {}
                None => self.remove_from_upper(layers, upper, here, parts, &name, done)?,
            }
        }
        Ok(())
    }

    /// Removes `name` and its whiteout from the upper directory `upper` of
    /// the merged directory `here` (made of `parts`), noting what changed.
    fn remove_from_upper(
        &self,
        layers: &Layers,
        upper: BorrowedFd<'_>,
        here: &Here<'_>,
        parts: &[Part],
        name: &[u8],
        done: &mut ResetDone,
    ) -> Result<()> {
        let dir = here.dir;
        let c = cstr(name)?;
        let shown = layers.lookup(&self.tree.inodes, parts, &c)?;
        if let Some(f) = &shown {
            done.files.push(f.attr.fileid);
        }
        let mut changed = false;
        if let Ok(w) = whiteout_name(name) {
            changed = hostdir::lending_write(&[upper], || {
                match rustix::fs::unlinkat(upper, &w, AtFlags::empty()) {
                    Ok(()) => Ok(true),
                    Err(rustix::io::Errno::NOENT) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            })?;
        }
        match rustix::fs::statat(upper, &c, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                changed = true;
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::Directory
                {
                    // Where the layers hold a directory too, each name
                    // under it leaves the kernel's caches (it may show the
                    // layers' entry now). Where they do not, the name alone
                    // does: dropping a directory's entry drops what is below.
                    match &shown {
                        Some(f) if f.kind() == FileKind::Directory && below_too(&f.parts) => {
                            let sub: OwnedFd = hostdir::open_dir(upper, &c)?;
                            self.forget_tree(layers, sub.as_fd(), f.attr.fileid, &f.parts, done)?;
                        }
                        _ => {}
                    }
                    self.discard_dir(upper, &c, done)?;
                } else {
                    hostdir::lending_write(&[upper], || {
                        Ok(rustix::fs::unlinkat(upper, &c, AtFlags::empty())?)
                    })?;
                }
            }
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        if changed {
            done.names.push((dir, name.to_vec()));
            done.changed_dir(upper)?;
            done.changed_path(here.path);
        }
        Ok(())
    }

    /// Notes every name under the upper directory `upper` (merged directory
    /// `dir`, which the layers hold too) as changed.
    fn forget_tree(
        &self,
        layers: &Layers,
        upper: BorrowedFd<'_>,
        dir: FileId,
        parts: &[Part],
        done: &mut ResetDone,
    ) -> Result<()> {
        for (name, _, is_dir) in hostdir::list(upper)? {
            let shown_name = match name.strip_prefix(b".wh.") {
                Some(hidden) if !is_hidden(hidden) => hidden.to_vec(),
                Some(_) => continue,
                None => name.clone(),
            };
            done.names.push((dir, shown_name.clone()));
            if let Some(f) = layers.lookup(&self.tree.inodes, parts, &cstr(&shown_name)?)? {
                done.files.push(f.attr.fileid);
                if is_dir && f.kind() == FileKind::Directory && below_too(&f.parts) {
                    let sub = hostdir::open_dir(upper, &cstr(&name)?)?;
                    self.forget_tree(layers, sub.as_fd(), f.attr.fileid, &f.parts, done)?;
                }
            }
        }
        Ok(())
    }
}

/// A merged directory a reset changes entries of: its id and its names
/// from the root.
#[derive(Clone, Copy)]
struct Here<'a> {
    dir: FileId,
    path: &'a [Vec<u8>],
}

/// Whether a merged directory of `parts` is also one of the layers'.
fn below_too(parts: &[Part]) -> bool {
    parts.iter().any(|p| p.layer != UPPER)
}

/// Removes the directory `name` in `dir` and everything in it. A directory
/// its owner may not read, search or change is made so first, as it goes:
/// a server that is not root could not empty it otherwise.
fn remove_tree_at(dir: BorrowedFd<'_>, name: &std::ffi::CStr) -> Result<()> {
    let mode = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?.st_mode;
    let mode = hostdir::permissions(mode as u32);
    if !mode.contains(Mode::RWXU) {
        hostdir::chmod_at(dir, name, mode | Mode::RWXU)?;
    }
    let sub = hostdir::open_dir(dir, name)?;
    for (entry, _, is_dir) in hostdir::list(sub.as_fd())? {
        let c = cstr(&entry)?;
        if is_dir {
            remove_tree_at(sub.as_fd(), &c)?;
        } else {
            rustix::fs::unlinkat(&sub, &c, AtFlags::empty())?;
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    Ok(())
}
