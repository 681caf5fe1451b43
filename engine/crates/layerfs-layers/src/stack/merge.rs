//! How the layers' directories merge into the tree clients see, following
//! overlayfs: a name is looked up top-down; a whiteout (`.wh.NAME`) in a
//! layer hides NAME in the layers below it, an entry in the same layer wins
//! over it; a directory merges with the directories of the same name below
//! it until one is opaque (holds `.wh..wh..opq`) or a layer holds something
//! else there; anything but a directory hides everything below it.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use layerfs_vfs::hostdir::{self, Host};
use layerfs_vfs::{Attr, Error, FileId, FileKind, Result};

use super::inodes::{Inodes, Origin};
use crate::{OPAQUE_MARKER, WHITEOUT_PREFIX};

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

pub fn whiteout_name(name: &[u8]) -> Result<CString> {
    let mut w = WHITEOUT_PREFIX.as_bytes().to_vec();
    w.extend_from_slice(name);
    if w.len() > layerfs_vfs::NAME_MAX {
        // Such a name can be created but, being in a lower layer, not removed.
        return Err(Error::NameTooLong);
    }
    hostdir::cstr(&w)
}

/// Whether names starting so are whiteouts and markers, never shown.
pub fn is_hidden(name: &[u8]) -> bool {
    name.starts_with(WHITEOUT_PREFIX.as_bytes())
}

fn exists(dir: BorrowedFd<'_>, name: &CStr) -> Result<bool> {
    match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NAMETOOLONG) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

pub fn has_whiteout(dir: BorrowedFd<'_>, name: &[u8]) -> Result<bool> {
    match whiteout_name(name) {
        Ok(w) => exists(dir, &w),
        Err(_) => Ok(false),
    }
}

pub fn is_opaque(dir: BorrowedFd<'_>) -> Result<bool> {
    exists(dir, &CString::new(OPAQUE_MARKER).expect("no NUL"))
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
        let mut found: Option<Found> = None;
        let mut bottom: Option<(usize, Attr)> = None;
        for part in parts {
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
                    let opaque = is_opaque(fd.as_fd())?;
                    f.parts.push(Part {
                        layer: part.layer,
                        fd,
                    });
                    bottom = Some((part.layer, host));
                    if opaque {
                        break;
                    }
                }
                Err(Error::NoEnt) => {
                    if has_whiteout(part.fd.as_fd(), name.to_bytes())? {
                        break;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let Some(mut f) = found else { return Ok(None) };
        let (layer, host) = bottom.unwrap_or((f.layer, f.host));
        let Origin { id, generation } =
            inodes.identity(self.tag(layer), host.fileid, Some(host.generation))?;
        f.attr.fileid = id;
        f.attr.generation = generation;
        if f.parts.len() > 1 {
            f.attr.nlink = 1;
        }
        Ok(Some(f))
    }

    /// Whether `name` shows through from the layers below `above` in the
    /// directory made of `parts`: what removing it from above would reveal.
    pub fn shows_below(&self, parts: &[Part], above: usize, name: &CStr) -> Result<bool> {
        for part in parts.iter().filter(|p| p.layer > above) {
            if exists(part.fd.as_fd(), name)? {
                return Ok(true);
            }
            if has_whiteout(part.fd.as_fd(), name.to_bytes())? {
                return Ok(false);
            }
        }
        Ok(false)
    }

    /// The names the directory made of `parts` shows, each once, with the
    /// identity of what each names and whether it is a directory: whiteouts
    /// and markers applied, not listed.
    pub fn list(&self, inodes: &Inodes, parts: &[Part]) -> Result<Vec<(Vec<u8>, FileId, bool)>> {
        struct Seen {
            id: FileId,
            is_dir: bool,
            /// A directory of the same name lies below: the identity is
            /// settled by a lookup, which knows where merging stops.
            merges: bool,
        }
        let mut hidden: HashSet<Vec<u8>> = HashSet::new();
        let mut seen: HashMap<Vec<u8>, Seen> = HashMap::new();
        let mut order = Vec::new();
        for part in parts {
            let mut whiteouts = Vec::new();
            for (name, ino, is_dir) in hostdir::list(part.fd.as_fd())? {
                if let Some(rest) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
                    if name != OPAQUE_MARKER.as_bytes() {
                        whiteouts.push(rest.to_vec());
                    }
                    continue;
                }
                if hidden.contains(&name) {
                    continue;
                }
                match seen.get_mut(&name) {
                    Some(s) => s.merges |= s.is_dir && is_dir,
                    None => {
                        let id = inodes.identity(self.tag(part.layer), ino, None)?.id;
                        let merges = false;
                        seen.insert(name.clone(), Seen { id, is_dir, merges });
                        order.push(name);
                    }
                }
            }
            hidden.extend(whiteouts);
        }
        let mut out = Vec::with_capacity(order.len());
        for name in order {
            let s = &seen[&name];
            let id = if s.merges {
                match self.lookup(inodes, parts, &hostdir::cstr(&name)?)? {
                    Some(f) => f.attr.fileid,
                    None => continue,
                }
            } else {
                s.id
            };
            out.push((name, id, s.is_dir));
        }
        Ok(out)
    }
}
