//! What the NFS and MOUNT programs share: the filesystem, its handles and
//! the identity of callers.

use std::sync::Arc;

use layerfs_rpc::Credentials;
use layerfs_vfs::{Attr, Caller, FileId, Filesystem};

use crate::Error;
use nfs3_types::nfs3::nfs_fh3;
use nfs3_types::xdr_codec::Opaque;

use crate::handle::FileHandle;

/// One exported filesystem.
pub struct Export {
    pub fs: Arc<dyn Filesystem>,
    /// Names this export in handles, and is its fsid.
    pub id: u64,
    /// The host path of the export, which clients may also mount by.
    pub host_path: Vec<u8>,
    /// Every caller is taken to be this uid and gid (no other groups).
    pub squash: Option<(u32, u32)>,
}

impl Export {
    pub fn new(fs: Arc<dyn Filesystem>, host_path: &[u8]) -> layerfs_vfs::Result<Export> {
        let root = fs.getattr(fs.root())?;
        // From the root's identity, not its path or the start time, so
        // handles stay valid across restarts and a moved export.
        let id =
            (root.fileid.rotate_left(32) ^ root.generation).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Ok(Export {
            fs,
            id,
            host_path: host_path.to_vec(),
            squash: None,
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
        .bytes()
    }

    pub fn root_handle(&self) -> Result<nfs_fh3, Error> {
        Ok(self.handle(&self.fs.getattr(self.fs.root())?))
    }

    /// The file a handle names, with its current attributes.
    /// Whether the file handle that `args` start with names a file the
    /// filesystem finds without a walk (a bad handle is answered at once).
    pub fn knows_handle_in(&self, args: &[u8]) -> bool {
        let Some(len) = args.get(..4) else {
            return true;
        };
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        match args
            .get(4..4 + len.min(64))
            .map(|h| FileHandle::decode(h, self.id))
        {
            Some(Ok(h)) => self.fs.knows(h.fileid),
            _ => true,
        }
    }

    /// Runs `op` on the file a handle names, with its current attributes.
    pub fn on<T>(
        &self,
        fh: &nfs_fh3,
        op: impl FnOnce(FileId, Attr) -> layerfs_vfs::Result<T>,
    ) -> Result<T, Error> {
        let (id, attr) = self.resolve(fh)?;
        Ok(op(id, attr)?)
    }

    pub fn resolve(&self, fh: &nfs_fh3) -> Result<(FileId, Attr), Error> {
        let h = FileHandle::decode(fh.data.as_ref(), self.id)?;
        let attr = self.fs.check_generation(h.fileid, h.generation)?;
        Ok((h.fileid, attr))
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
                gids: Vec::new(),
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
