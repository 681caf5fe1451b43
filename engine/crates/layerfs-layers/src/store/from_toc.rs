//! A lazy layer's tree from its table of contents: every entry made, each
//! regular file at its size and all holes.
//!
//! Most of a ready lazy pull's time is here (tens of thousands of files
//! created), so where the entries cannot touch each other's paths they are
//! written side by side: first every directory, in order; then the other
//! entries, split between threads; then the hard links, in order, once
//! what they name exists. Where a path comes twice, or an entry lies under
//! one that is not a directory, the table is written in order on one
//! thread, as a tar is, and the later entry wins.

use std::collections::HashSet;
use std::io;
use std::path::{Component, Path};

use rustc_hash::FxHashMap;

use super::writer::{Body, LayerWriter, Meta, Refused};
use crate::digest::Known;
use crate::lazy::{Entry, EntryKind, LazyFile};

/// Entries below this many are written on one thread: threads cost more
/// than they save.
const SIDE_BY_SIDE_FROM: usize = 4096;

/// What a table of contents made: what was written of each regular file
/// (by inode number), and the files whose data is still to come.
pub(super) struct Made {
    pub known: FxHashMap<u64, Known>,
    pub lazy: Vec<LazyFile>,
}

/// Writes `entries` into the staging directory `staged`.
pub(super) fn write(staged: &Path, entries: &[Entry]) -> io::Result<Made> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    if threads < 2 || entries.len() < SIDE_BY_SIDE_FROM || !independent(entries) {
        let mut layer = LayerWriter::new(staged)?;
        for entry in entries {
            put(&mut layer, entry)?;
        }
        let known = layer.finish()?;
        // Later entries may have replaced earlier ones: the tree says which
        // files are there.
        let lazy = crate::lazy::files_in(staged, entries)?;
        return Ok(Made { known, lazy });
    }
    let known = side_by_side(staged, entries, threads)?;
    // Each path once, nothing under a file: every file of the table is there.
    let mut lazy = Vec::new();
    for entry in entries {
        if let EntryKind::File { pieces, .. } = &entry.kind {
            if !pieces.is_empty() {
                lazy.push(LazyFile {
                    path: crate::lazy::utf8_path(&entry.path)?.to_owned(),
                    pieces: pieces.clone(),
                    mode: Some(entry.mode & crate::lazy::PERMISSIONS),
                });
            }
        }
    }
    Ok(Made { known, lazy })
}

/// Writes `entries`, which [`independent`] allows, on `threads` threads.
fn side_by_side(
    staged: &Path,
    entries: &[Entry],
    threads: usize,
) -> io::Result<FxHashMap<u64, Known>> {
    let mut layer = LayerWriter::new(staged)?;
    let (dirs, rest): (Vec<&Entry>, Vec<&Entry>) = entries
        .iter()
        .partition(|e| matches!(e.kind, EntryKind::Dir));
    let (links, files): (Vec<&Entry>, Vec<&Entry>) = rest
        .into_iter()
        .partition(|e| matches!(e.kind, EntryKind::HardLink(_)));
    for entry in &dirs {
        put(&mut layer, entry)?;
    }
    // Directories the table does not list are made here, not by two
    // threads at once.
    for entry in &files {
        layer
            .make_parents(&entry.path)
            .map_err(|e| refused(entry, e))?;
    }
    let share = files.len().div_ceil(threads);
    let written = std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(share)
            .map(|part| {
                scope.spawn(move || {
                    let mut worker = LayerWriter::new(staged)?;
                    for entry in part {
                        put(&mut worker, entry)?;
                    }
                    Ok::<_, io::Error>(worker.into_files())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(io::Error::other("a writer panicked")))
            })
            .collect::<io::Result<Vec<_>>>()
    })?;
    for files in written {
        layer.absorb(files);
    }
    for entry in &links {
        put(&mut layer, entry)?;
    }
    layer.finish()
}

/// Whether no two entries touch the same path: each path once, and none
/// under a path an entry makes something other than a directory.
fn independent(entries: &[Entry]) -> bool {
    let mut paths = HashSet::with_capacity(entries.len());
    let mut not_dirs = HashSet::new();
    for entry in entries {
        let Some(key) = key(&entry.path) else {
            return false;
        };
        if !matches!(entry.kind, EntryKind::Dir) {
            not_dirs.insert(key.clone());
        }
        if !paths.insert(key) {
            return false;
        }
    }
    paths.iter().all(|key: &Vec<u8>| {
        let mut ancestors = key
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'/')
            .map(|(i, _)| &key[..i]);
        ancestors.all(|a| !not_dirs.contains(a))
    })
}

/// A path's names joined by `/`, as every spelling of it gives them; None
/// for one that leaves the layer (the writer refuses it in order).
fn key(path: &Path) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let mut key = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(name) => {
                if !key.is_empty() {
                    key.push(b'/');
                }
                key.extend_from_slice(name.as_bytes());
            }
            Component::CurDir | Component::RootDir => {}
            _ => return None,
        }
    }
    Some(key)
}

/// Writes one entry of the table.
fn put(layer: &mut LayerWriter, entry: &Entry) -> io::Result<()> {
    let meta = Meta {
        mode: entry.mode,
        uid: entry.uid,
        gid: entry.gid,
        atime: None,
        mtime: entry.mtime,
        xattrs: entry.xattrs.clone(),
    };
    let mut inline: &[u8];
    let body = match &entry.kind {
        EntryKind::Inline(data) => {
            inline = data;
            Body::File(&mut inline)
        }
        EntryKind::Dir => Body::Dir,
        EntryKind::File { size, content, .. } => Body::Lazy {
            size: *size,
            content: *content,
        },
        EntryKind::Symlink(target) => Body::Symlink(target),
        EntryKind::HardLink(target) => Body::HardLink(target),
        EntryKind::Fifo => Body::Fifo,
        EntryKind::CharDevice(rdev) => Body::CharDevice(*rdev),
        EntryKind::BlockDevice(rdev) => Body::BlockDevice(*rdev),
    };
    layer
        .put(&entry.path, body, &meta)
        .map_err(|e| refused(entry, e))
}

fn refused(entry: &Entry, e: Refused) -> io::Error {
    match e {
        Refused::Outside => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {}", entry.path.display(), super::OUTSIDE),
        ),
        Refused::Cannot(e) => io::Error::new(e.kind(), format!("{}: {e}", entry.path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn entry(path: &str, kind: EntryKind) -> Entry {
        Entry {
            path: PathBuf::from(path),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: None,
            xattrs: Vec::new(),
        }
    }

    fn file(path: &str) -> Entry {
        let empty = EntryKind::File {
            size: 0,
            content: [0; 32],
            pieces: Vec::new(),
        };
        entry(path, empty)
    }

    #[test]
    fn only_tables_whose_paths_cannot_collide_are_written_side_by_side() {
        let dir = |p: &str| entry(p, EntryKind::Dir);
        assert!(independent(&[
            dir("a"),
            file("a/b"),
            file("./c"),
            dir("d/e")
        ]));
        // The same path twice, however spelled: the later one wins, in order.
        assert!(!independent(&[file("a/b"), file("./a/b")]));
        assert!(!independent(&[dir("a"), dir("a/")]));
        // Something under a file, a symlink or a whiteout's target file.
        assert!(!independent(&[file("a"), file("a/.wh.b")]));
        let link = entry("l", EntryKind::Symlink(PathBuf::from("/etc")));
        assert!(!independent(&[link, file("l/x")]));
        // A path that leaves the layer is left for the writer to refuse.
        assert!(!independent(&[file("../x")]));
    }
}
