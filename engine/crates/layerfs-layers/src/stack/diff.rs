//! What a workspace changed over its layers, read from its upper: each
//! path added, changed (and how) or deleted, as `podman diff` shows a
//! container's changes.
//!
//! The upper holds every change: an entry of its own is added (no layer
//! below shows the name) or changed (one does); a whiteout deletes the
//! name below it; an opaque directory deletes every name the layers held
//! under it that the upper does not hold again. A directory is changed
//! when its own attributes differ from the layers' (an entry made or
//! removed in it moves its modification time). Files the NFS client keeps
//! for a file removed while open are not the workspace's contents: they
//! never show.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd};

use layerfs_vfs::hostdir::{self, cstr};
use layerfs_vfs::{Attr, FileKind, Result};

use super::commit::is_client_debris;
use super::merge::{Found, Layers, Part, UPPER};
use super::tree::Tree;
use super::whiteouts::{named, Named};
use super::xattrs;
use super::StackFs;

/// How a path changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    Added,
    Changed,
    Deleted,
}

/// One path the workspace changed, from its root (`/etc/passwd`), and for
/// a change what differs: `type`, `data`, `mode`, `owner`, `times`,
/// `xattrs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub path: Vec<u8>,
    pub kind: ChangeKind,
    pub what: Vec<&'static str>,
}

impl StackFs {
    /// The workspace's changes over its layers, sorted by path. Taken at
    /// one moment: no change waits behind it nor runs beside it (a FUSE
    /// passthrough write, which asks no one, aside).
    pub fn diff(&self) -> Result<Vec<Change>> {
        let layers = self.tree.write_layers();
        let _ns = self.upper.lock_ns();
        let mut out = Vec::new();
        let root = &layers.root_parts;
        let upper = root.first().filter(|p| p.layer == UPPER);
        if let Some(upper) = upper {
            let lower: Vec<Part> = root.iter().filter(|p| p.layer != UPPER).cloned().collect();
            self.diff_dir(&layers, &[], upper.fd.as_fd(), &lower, &mut out)?;
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// The changes below the upper directory `upper` at `path`, over the
    /// layers' directory `lower` (its parts, top first; none where the
    /// layers hold no directory there).
    fn diff_dir(
        &self,
        layers: &Layers,
        path: &[u8],
        upper: BorrowedFd<'_>,
        lower: &[Part],
        out: &mut Vec<Change>,
    ) -> Result<()> {
        let mut entries = Vec::new();
        let mut opaque = false;
        let mut whiteouts = Vec::new();
        for (name, _, _) in hostdir::list(upper)? {
            match named(&name) {
                Named::Opaque => opaque = true,
                Named::Whiteout(hidden) if !hidden.starts_with(b".wh.") => {
                    whiteouts.push(hidden.to_vec())
                }
                Named::Whiteout(_) => {}
                Named::Shown if is_client_debris(&name) => {}
                Named::Shown => entries.push(name),
            }
        }
        let host = &layers.all[UPPER].host;
        for name in &entries {
            let c = cstr(name)?;
            let mine = host.stats.at(upper, &*c)?;
            let below = match lower.is_empty() {
                true => None,
                false => layers.lookup(&self.tree.inodes, lower, &c)?,
            };
            let at = child(path, name);
            let sub = (mine.kind == FileKind::Directory)
                .then(|| hostdir::open_dir(upper, &c))
                .transpose()?;
            match below {
                None => {
                    out.push(change(&at, ChangeKind::Added, Vec::new()));
                    if let Some(sub) = sub {
                        self.diff_dir(layers, &at, sub.as_fd(), &[], out)?;
                    }
                }
                Some(f) => {
                    let what = differences(&self.tree, upper, &c, &mine, &f)?;
                    if !what.is_empty() {
                        out.push(change(&at, ChangeKind::Changed, what));
                    }
                    let below_dir = f.kind() == FileKind::Directory;
                    match sub {
                        Some(sub) if below_dir => {
                            self.diff_dir(layers, &at, sub.as_fd(), &f.parts, out)?
                        }
                        Some(sub) => self.diff_dir(layers, &at, sub.as_fd(), &[], out)?,
                        None if below_dir => self.all_deleted(layers, &at, &f.parts, out)?,
                        None => {}
                    }
                }
            }
        }
        for hidden in whiteouts {
            let c = cstr(&hidden)?;
            if lower.is_empty() || opaque {
                continue;
            }
            if let Some(f) = layers.lookup(&self.tree.inodes, lower, &c)? {
                let at = child(path, &hidden);
                out.push(change(&at, ChangeKind::Deleted, Vec::new()));
                if f.kind() == FileKind::Directory {
                    self.all_deleted(layers, &at, &f.parts, out)?;
                }
            }
        }
        if opaque && !lower.is_empty() {
            for e in layers.list(&self.tree.inodes, lower)? {
                if entries.iter().any(|n| n[..] == e.name[..]) {
                    continue;
                }
                let at = child(path, &e.name);
                out.push(change(&at, ChangeKind::Deleted, Vec::new()));
                if e.is_dir {
                    let c = cstr(&e.name)?;
                    if let Some(f) = layers.lookup(&self.tree.inodes, lower, &c)? {
                        self.all_deleted(layers, &at, &f.parts, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Every name below the layers' directory `parts` at `path`: deleted.
    fn all_deleted(
        &self,
        layers: &Layers,
        path: &[u8],
        parts: &[Part],
        out: &mut Vec<Change>,
    ) -> Result<()> {
        for e in layers.list(&self.tree.inodes, parts)? {
            let at = child(path, &e.name);
            out.push(change(&at, ChangeKind::Deleted, Vec::new()));
            if e.is_dir {
                if let Some(f) = layers.lookup(&self.tree.inodes, parts, &cstr(&e.name)?)? {
                    self.all_deleted(layers, &at, &f.parts, out)?;
                }
            }
        }
        Ok(())
    }
}

fn child(path: &[u8], name: &[u8]) -> Vec<u8> {
    let mut at = path.to_vec();
    at.push(b'/');
    at.extend_from_slice(name);
    at
}

fn change(path: &[u8], kind: ChangeKind, what: Vec<&'static str>) -> Change {
    Change {
        path: path.to_vec(),
        kind,
        what,
    }
}

/// How the upper's entry `name` in `upper` (`mine`) differs from what the
/// layers show there (`below`).
fn differences(
    tree: &Tree,
    upper: BorrowedFd<'_>,
    name: &CString,
    mine: &Attr,
    below: &Found,
) -> Result<Vec<&'static str>> {
    let theirs = &below.host;
    if mine.kind != theirs.kind {
        return Ok(vec!["type"]);
    }
    let mut what = Vec::new();
    let data = match mine.kind {
        FileKind::Regular => {
            mine.size != theirs.size
                || !same_bytes(tree, upper, name, below.parent.as_fd(), &below.name)?
        }
        FileKind::Symlink => {
            let target =
                |dir: BorrowedFd<'_>, n: &CString| rustix::fs::readlinkat(dir, n, Vec::new());
            target(upper, name)? != target(below.parent.as_fd(), &below.name)?
        }
        FileKind::Directory => false,
        _ => mine.rdev != theirs.rdev,
    };
    if data {
        what.push("data");
    }
    if mine.mode & 0o7777 != theirs.mode & 0o7777 {
        what.push("mode");
    }
    if (mine.uid, mine.gid) != (theirs.uid, theirs.gid) {
        what.push("owner");
    }
    if mine.mtime != theirs.mtime {
        what.push("times");
    }
    if xattrs::served(upper, name.as_bytes())?
        != xattrs::served(below.parent.as_fd(), below.name.as_bytes())?
    {
        what.push("xattrs");
    }
    Ok(what)
}

/// Whether two regular files of one size hold the same bytes: `a` the
/// upper's, `b` a lower layer's, read through `tree`'s fill.
fn same_bytes(
    tree: &Tree,
    a_dir: BorrowedFd<'_>,
    a: &CString,
    b_dir: BorrowedFd<'_>,
    b: &CString,
) -> Result<bool> {
    let a = hostdir::open_regular(a_dir, a, rustix::fs::OFlags::RDONLY)?;
    let b = tree.open_lower(b_dir, b)?;
    let (mut x, mut y) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    let mut offset = 0;
    loop {
        let n = rustix::io::pread(&a, &mut x, offset)?;
        let m = b.pread(&mut y[..n.max(1)], offset)?;
        if n != m || x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        offset += n as u64;
    }
}
