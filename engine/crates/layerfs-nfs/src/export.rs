//! What the NFS and MOUNT programs share: the exported filesystems, their
//! handles and the identity of callers.

use std::sync::Arc;

use parking_lot::RwLock;

use layerfs_rpc::Credentials;
use layerfs_vfs::{Attr, Caller, FileId, Filesystem};

use crate::Error;
use nfs3_types::nfs3::nfs_fh3;
use nfs3_types::xdr_codec::Opaque;

use crate::handle::{Checked, FileHandle, HandleKey, SignedHandles};

/// One exported filesystem.
pub struct Export {
    pub fs: Arc<dyn Filesystem>,
    /// Names this export in handles, and is its fsid.
    pub id: u64,
    /// The path clients mount it by (`/` when a server has one export).
    pub path: Vec<u8>,
    /// The host path of the export, which clients may also mount by
    /// (empty: none).
    pub host_path: Vec<u8>,
    /// Every caller is taken to be this uid and gid (no other groups).
    pub squash: Option<(u32, u32)>,
    /// Signs its handles; kept with the store so handles outlive restarts.
    pub key: HandleKey,
    /// Handles it signed lately, for listings (`SignedHandles::default()`).
    pub signed: SignedHandles,
}

impl Export {
    /// An export of `fs` as `/`, its handles signed with a fresh key (set
    /// `key` to one kept with the store for handles that outlive the
    /// process).
    pub fn new(fs: Arc<dyn Filesystem>, host_path: &[u8]) -> layerfs_vfs::Result<Export> {
        let root = fs.getattr(fs.root())?;
        // From the root's identity, not its path or the start time, so
        // handles stay valid across restarts and a moved export.
        let id =
            (root.fileid.rotate_left(32) ^ root.generation).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Ok(Export {
            fs,
            id,
            path: b"/".to_vec(),
            host_path: host_path.to_vec(),
            squash: None,
            key: HandleKey::random()?,
            signed: SignedHandles::default(),
        })
    }

    pub fn handle(&self, attr: &Attr) -> nfs_fh3 {
        nfs_fh3 {
            data: Opaque::owned(self.handle_bytes(attr).to_vec()),
        }
    }

    pub fn handle_bytes(&self, attr: &Attr) -> [u8; crate::handle::LEN] {
        FileHandle {
            export: self.id,
            fileid: attr.fileid,
            generation: attr.generation,
        }
        .bytes(&self.key)
    }

    /// Signs handles of this export for a listing: each file's handle is
    /// signed once while it stays in [`SignedHandles`].
    pub fn listing_signer(&self) -> impl FnMut(&Attr) -> [u8; crate::handle::LEN] + '_ {
        let mut sign = self.signed.signer(&self.key);
        move |attr| {
            sign(&FileHandle {
                export: self.id,
                fileid: attr.fileid,
                generation: attr.generation,
            })
        }
    }

    pub fn root_handle(&self) -> Result<nfs_fh3, Error> {
        Ok(self.handle(&self.fs.getattr(self.fs.root())?))
    }

    /// Runs `op` on the file a handle names. `op` reads whatever attributes
    /// it needs itself, under its own lock.
    pub fn on<T>(
        &self,
        fh: Checked,
        op: impl FnOnce(FileId) -> layerfs_vfs::Result<T>,
    ) -> Result<T, Error> {
        Ok(op(self.id_of(fh)?)?)
    }

    /// The file a handle names, checked to still be the one it was made for.
    pub fn id_of(&self, fh: Checked) -> Result<FileId, Error> {
        let h = fh?;
        self.fs.still_names(h.fileid, h.generation)?;
        Ok(h.fileid)
    }

    /// Runs `op` on the file a handle names, where `op` reads the file's
    /// attributes itself and returns them beside its result: the handle's
    /// generation is checked against those, not read first. On failure,
    /// the file's attributes if the handle still names it.
    pub fn on_read<T>(
        &self,
        fh: Checked,
        op: impl FnOnce(FileId) -> layerfs_vfs::Result<(T, Attr)>,
    ) -> Result<(T, Attr), (Error, Option<Attr>)> {
        let h = fh.map_err(|e| (e, None))?;
        match op(h.fileid) {
            Ok((found, attr)) if attr.generation == h.generation => Ok((found, attr)),
            // The id now names another file: what `op` did was on that one.
            Ok(_) => Err((layerfs_vfs::Error::Stale.into(), None)),
            // A stale handle says so before whatever `op` met.
            Err(e) => match self.resolve(fh) {
                Ok((_, attr)) => Err((e.into(), Some(attr))),
                Err(stale) => Err((stale, None)),
            },
        }
    }

    /// The file a handle names and its attributes.
    pub fn resolve(&self, fh: Checked) -> Result<(FileId, Attr), Error> {
        let h = fh?;
        let attr = self.fs.check_generation(h.fileid, h.generation)?;
        Ok((h.fileid, attr))
    }

    /// Decodes a handle of this export from a call's arguments and checks
    /// its MAC.
    pub fn check(&self, bytes: &[u8]) -> Checked {
        FileHandle::decode(bytes, self.id, &self.key)
    }

    /// The attributes of the file `fh` names, if it still does: what a
    /// failure reply tells of it.
    pub fn attr_after(&self, fh: Checked) -> Option<Attr> {
        self.resolve(fh).ok().map(|(_, attr)| attr)
    }
}

impl Export {
    /// The caller a credential describes (AUTH_NONE: nobody), or the one
    /// identity every caller is squashed to.
    pub fn caller(&self, cred: &Credentials) -> Caller {
        if let Some((uid, gid)) = self.squash {
            return Caller {
                uid,
                gid,
                gids: layerfs_vfs::Groups::new(),
            };
        }
        match cred {
            Credentials::Sys(sys) => Caller {
                uid: sys.uid,
                gid: sys.gid,
                gids: sys.gids.clone(),
            },
            Credentials::None => Caller::nobody(),
        }
    }
}

/// The exports one server serves: found by the export id in a handle, or by
/// the path a client mounts. Exports come and go while the server runs;
/// all of them sign handles with the table's key.
pub struct Exports {
    key: HandleKey,
    all: RwLock<Vec<Arc<Export>>>,
}

impl Exports {
    /// An empty table whose exports sign handles with `key`.
    pub fn new(key: HandleKey) -> Exports {
        Exports {
            key,
            all: RwLock::new(Vec::new()),
        }
    }

    /// A table of one export.
    pub fn one(export: Export) -> Exports {
        Exports {
            key: export.key,
            all: RwLock::new(vec![Arc::new(export)]),
        }
    }

    /// Adds `export`; refused when its id or path is already served, or its
    /// key is not the table's.
    pub fn add(&self, export: Export) -> Result<Arc<Export>, std::io::Error> {
        if export.key != self.key {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an export must sign handles with its server's key",
            ));
        }
        let mut all = self.all.write();
        if let Some(other) = all
            .iter()
            .find(|e| e.id == export.id || e.path == export.path)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "export {} clashes with {} (id {:x})",
                    String::from_utf8_lossy(&export.path),
                    String::from_utf8_lossy(&other.path),
                    other.id
                ),
            ));
        }
        let export = Arc::new(export);
        all.push(export.clone());
        Ok(export)
    }

    /// Stops serving export `id`: its handles are STALE from now on.
    pub fn remove(&self, id: u64) -> Option<Arc<Export>> {
        let mut all = self.all.write();
        let at = all.iter().position(|e| e.id == id)?;
        Some(all.swap_remove(at))
    }

    /// Whether `export` is still served: one found when a call was decoded
    /// may have been removed before the call runs.
    pub fn serves(&self, export: &Arc<Export>) -> bool {
        self.all.read().iter().any(|e| Arc::ptr_eq(e, export))
    }

    pub fn get(&self, id: u64) -> Option<Arc<Export>> {
        self.all.read().iter().find(|e| e.id == id).cloned()
    }

    pub fn list(&self) -> Vec<Arc<Export>> {
        self.all.read().clone()
    }

    /// The export of a call's first handle (every NFS procedure's arguments
    /// but NULL's start with one): a malformed or a forged handle is
    /// BADHANDLE, one of ours for an export no longer served is STALE.
    pub fn of_handle(&self, bytes: &[u8]) -> Result<Arc<Export>, Error> {
        let handle = FileHandle::unchecked(bytes)?;
        match self.get(handle.export) {
            Some(export) => Ok(export),
            None if FileHandle::signed_with(bytes, &self.key) => {
                Err(Error::Fs(layerfs_vfs::Error::Stale))
            }
            None => Err(Error::BadHandle),
        }
    }

    /// The export a MNT path names and the rest of the path below it: the
    /// export whose path, or host path, is the longest whole-component
    /// prefix of `path`.
    pub fn for_path<'p>(&self, path: &'p [u8]) -> Option<(Arc<Export>, &'p [u8])> {
        let all = self.all.read();
        let mut best: Option<(usize, &Arc<Export>, &'p [u8])> = None;
        for export in all.iter() {
            for prefix in [&export.path, &export.host_path] {
                let Some(rest) = below(path, prefix) else {
                    continue;
                };
                if best.is_none_or(|(len, _, _)| prefix.len() > len) {
                    best = Some((prefix.len(), export, rest));
                }
            }
        }
        best.map(|(_, export, rest)| (export.clone(), rest))
    }
}

/// The rest of `path` below `prefix`, when `prefix` is a whole-component
/// prefix of it.
fn below<'p>(path: &'p [u8], prefix: &[u8]) -> Option<&'p [u8]> {
    if prefix.is_empty() {
        return None;
    }
    let rest = path.strip_prefix(prefix.strip_suffix(b"/").unwrap_or(prefix))?;
    (rest.is_empty() || rest.starts_with(b"/")).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::below;

    #[test]
    fn a_mount_path_is_below_whole_components_only() {
        assert_eq!(below(b"/", b"/"), Some(&b"/"[..]));
        assert_eq!(below(b"/a/b", b"/"), Some(&b"/a/b"[..]));
        assert_eq!(below(b"/ws/x", b"/ws"), Some(&b"/x"[..]));
        assert_eq!(below(b"/ws", b"/ws"), Some(&b""[..]));
        assert_eq!(below(b"/wsx", b"/ws"), None);
        assert_eq!(below(b"/w", b"/ws"), None);
        assert_eq!(below(b"/ws", b""), None);
    }
}
