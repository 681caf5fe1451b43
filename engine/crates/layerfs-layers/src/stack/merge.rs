//! How the layers' directories merge into the tree clients see, following
//! overlayfs: a name is looked up top-down; a whiteout (`.wh.NAME`) in a
//! layer hides NAME in the layers below it, an entry in the same layer wins
//! over it; a directory merges with the directories of the same name below
//! it until one is opaque (holds `.wh..wh..opq`) or a layer holds something
//! else there; anything but a directory hides everything below it.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use layerfs_vfs::hostdir::{self, Host};
use layerfs_vfs::{Attr, Error, FileId, FileKind, Result};

use super::dir_index::{DirIndex, Indexes};
use super::inodes::{Inodes, Origin};
use super::whiteouts::{exists, has_whiteout, is_opaque};

/// Index of the writable upper in [`Layers::all`]; the others follow it top-down.
pub const UPPER: usize = 0;
pub struct Layer {
    pub tag: u16,
    pub root: Arc<OwnedFd>,
    pub host: Host,
}

/// The stack, top first: the upper, then the layers below it.
pub struct Layers {
    pub all: Vec<Layer>,
    /// Lower directories' entries, by layer and host inode.
    pub indexes: Indexes,
    /// Changes at each commit; caches keyed by layer index check it.
    pub generation: u64,
    /// The root's parts: each layer's root, down to the first opaque one.
    pub root_parts: Vec<Part>,
}

/// One layer's directory at a visible directory's path.
#[derive(Clone)]
pub struct Part {
    pub layer: usize,
    pub fd: Arc<OwnedFd>,
    /// The directory's host inode number.
    pub ino: u64,
}

/// One name of a merged listing.
pub struct Listed {
    pub name: Box<[u8]>,
    pub id: FileId,
    pub is_dir: bool,
    /// The directory holding the only instance, whose attributes are the
    /// entry's; `None` for a directory merged from several layers.
    pub alone_in: Option<Part>,
}

/// A visible entry.
#[derive(Clone)]
pub struct Found {
    /// Its name in its parent directory (`.` for the root).
    pub name: CString,
    /// The layer of its top instance, whose attributes it shows.
    pub layer: usize,
    /// The directory of that layer that holds it.
    pub parent: Arc<OwnedFd>,
    /// The top instance's attributes as the host has them.
    pub host: Attr,
    /// What clients see: `host` with the workspace id and generation.
    pub attr: Attr,
    /// For a directory, the directories that merge into it, top first.
    pub parts: Vec<Part>,
}

impl Found {
    pub fn kind(&self) -> FileKind {
        self.attr.kind
    }

    /// What clients see of `host`, new attributes of this entry's top instance.
    pub fn shown(&self, host: Attr) -> Attr {
        Attr {
            fileid: self.attr.fileid,
            generation: self.attr.generation,
            nlink: if self.parts.len() > 1 { 1 } else { host.nlink },
            ..host
        }
    }
}

impl Layers {
    pub fn tag(&self, layer: usize) -> u16 {
        self.all[layer].tag
    }

    pub fn find_root_parts(&self) -> Result<Vec<Part>> {
        let mut parts = Vec::new();
        for (layer, l) in self.all.iter().enumerate() {
            parts.push(Part {
                layer,
                fd: l.root.clone(),
                ino: rustix::fs::fstat(&*l.root)?.st_ino,
            });
            if is_opaque(l.root.as_fd())? {
                break;
            }
        }
        Ok(parts)
    }

    /// The visible directory made of `parts`, as an entry (the root's).
    pub fn dir_found(&self, inodes: &Inodes, id: FileId, parts: Vec<Part>) -> Result<Found> {
        let top = &parts[0];
        let host = self.all[top.layer].host.stats.fd(top.fd.as_fd())?;
        let mut attr = host;
        attr.fileid = id;
        attr.generation = inodes.workspace;
        if parts.len() > 1 {
            attr.nlink = 1;
        }
        Ok(Found {
            name: CString::new(".").expect("no NUL"),
            layer: top.layer,
            parent: top.fd.clone(),
            host,
            attr,
            parts,
        })
    }

    /// Looks `name` up in the directory made of `parts`.
    pub fn lookup(&self, inodes: &Inodes, parts: &[Part], name: &CStr) -> Result<Option<Found>> {
        Ok(self.lookup_for_new(inodes, parts, name)?.0)
    }

    /// Looks `name` up, as [`Layers::lookup`], and says whether a whiteout
    /// in the upper part hid it: what making an entry of that name has to
    /// remove. Asked only where the upper holds no entry of that name; a
    /// directory without an upper part gets a new, empty one.
    pub fn lookup_for_new(
        &self,
        inodes: &Inodes,
        parts: &[Part],
        name: &CStr,
    ) -> Result<(Option<Found>, bool)> {
        let mut found: Option<Found> = None;
        let mut whiteout_in_upper = false;
        let mut bottom: Option<(usize, Attr)> = None;
        for part in parts {
            if let Some(index) = self.index(part)? {
                // Nothing to ask the host when a layer has no such name.
                if !index.entries.contains_key(name.to_bytes()) {
                    if index.whiteouts.contains(name.to_bytes()) {
                        break;
                    }
                    continue;
                }
            }
            let stats = &self.all[part.layer].host.stats;
            match stats.at(part.fd.as_fd(), name) {
                Ok(host) => {
                    if let Some(f) = &found {
                        if host.kind != FileKind::Directory || f.host.kind != FileKind::Directory {
                            break;
                        }
                    }
                    let is_dir = host.kind == FileKind::Directory;
                    let f = found.get_or_insert_with(|| Found {
                        name: name.to_owned(),
                        layer: part.layer,
                        parent: part.fd.clone(),
                        host,
                        attr: host,
                        parts: Vec::new(),
                    });
                    if !is_dir {
                        break;
                    }
                    let fd = Arc::new(hostdir::open_dir(part.fd.as_fd(), name)?);
                    let child = Part {
                        layer: part.layer,
                        fd,
                        ino: host.fileid,
                    };
                    let opaque = match self.index(&child)? {
                        Some(index) => index.opaque,
                        None => is_opaque(child.fd.as_fd())?,
                    };
                    if f.parts.is_empty() && part.layer != UPPER {
                        // Reading its entries may have moved its atime.
                        f.host = stats.fd(child.fd.as_fd())?;
                        f.attr = f.host;
                    }
                    f.parts.push(child);
                    bottom = Some((part.layer, host));
                    if opaque {
                        break;
                    }
                }
                Err(Error::NoEnt) => {
                    // A whiteout is made only over a name a layer below
                    // holds: where none can, the upper has none to ask for.
                    let may_hide =
                        part.layer != UPPER || self.below_may_hold(parts, name.to_bytes());
                    if may_hide && has_whiteout(part.fd.as_fd(), name.to_bytes())? {
                        whiteout_in_upper = part.layer == UPPER;
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let Some(mut f) = found else {
            return Ok((None, whiteout_in_upper));
        };
        let (layer, host) = bottom.unwrap_or((f.layer, f.host));
        let Origin { id, generation } =
            inodes.identity(self.tag(layer), host.fileid, Some(host.generation))?;
        f.attr.fileid = id;
        f.attr.generation = generation;
        if f.parts.len() > 1 {
            f.attr.nlink = 1;
        }
        Ok((Some(f), whiteout_in_upper))
    }

    /// Whether `name` shows through from the layers below `above` in the
    /// directory made of `parts`: what removing it from above would reveal.
    pub fn shows_below(&self, parts: &[Part], above: usize, name: &CStr) -> Result<bool> {
        for part in parts.iter().filter(|p| p.layer > above) {
            if let Some(index) = self.index(part)? {
                if index.entries.contains_key(name.to_bytes()) {
                    return Ok(true);
                }
                if index.whiteouts.contains(name.to_bytes()) {
                    return Ok(false);
                }
                continue;
            }
            if exists(part.fd.as_fd(), name)? {
                return Ok(true);
            }
            if has_whiteout(part.fd.as_fd(), name.to_bytes())? {
                return Ok(false);
            }
        }
        Ok(false)
    }

    /// Whether a layer below the upper may hold `name` in the directory
    /// made of `parts`, from the indexes already read alone: `true` where
    /// one is not.
    pub fn below_may_hold(&self, parts: &[Part], name: &[u8]) -> bool {
        parts
            .iter()
            .filter(|p| p.layer != UPPER)
            .any(|p| self.indexes.may_hold((p.layer, p.ino), name))
    }

    /// The entries of `part`'s directory if it is in a read-only layer,
    /// read the first time they are asked for.
    fn index(&self, part: &Part) -> Result<Option<Arc<DirIndex>>> {
        if part.layer == UPPER {
            return Ok(None);
        }
        let key = (part.layer, part.ino);
        if let Some(index) = self.indexes.get(key) {
            return Ok(Some(index));
        }
        let index = Arc::new(DirIndex::read(part.fd.as_fd())?);
        self.indexes.keep(key, index.clone());
        Ok(Some(index))
    }

    /// The names the directory made of `parts` shows, each once:
    /// whiteouts and markers applied, not listed.
    pub fn list(&self, inodes: &Inodes, parts: &[Part]) -> Result<Vec<Listed>> {
        struct Seen {
            listed: Listed,
            /// A directory of the same name lies below: the identity is
            /// settled by a lookup, which knows where merging stops.
            merges: bool,
        }
        let mut hidden: HashSet<Box<[u8]>> = HashSet::new();
        let mut seen: HashMap<Box<[u8]>, Seen> = HashMap::new();
        let mut order = Vec::new();
        for part in parts {
            let index = match self.index(part)? {
                Some(index) => index,
                None => Arc::new(DirIndex::read(part.fd.as_fd())?),
            };
            for (name, &(ino, is_dir)) in &index.entries {
                if hidden.contains(name) {
                    continue;
                }
                match seen.get_mut(name) {
                    Some(s) => s.merges |= s.listed.is_dir && is_dir,
                    None => {
                        let id = inodes.identity(self.tag(part.layer), ino, None)?.id;
                        let listed = Listed {
                            name: name.clone(),
                            id,
                            is_dir,
                            alone_in: Some(part.clone()),
                        };
                        let merges = false;
                        seen.insert(name.clone(), Seen { listed, merges });
                        order.push(name.clone());
                    }
                }
            }
            hidden.extend(index.whiteouts.iter().cloned());
        }
        let mut out = Vec::with_capacity(order.len());
        for name in order {
            let Some(mut s) = seen.remove(&name) else {
                continue;
            };
            if s.merges {
                match self.lookup(inodes, parts, &hostdir::cstr(&name)?) {
                    Ok(Some(f)) if f.parts.len() > 1 => {
                        s.listed.id = f.attr.fileid;
                        s.listed.alone_in = None;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => continue,
                    // One instance is on another filesystem: the name is
                    // listed, and its lookup gives the error.
                    Err(Error::XDev) => s.listed.alone_in = None,
                    Err(e) => return Err(e),
                }
            }
            out.push(s.listed);
        }
        Ok(out)
    }
}
