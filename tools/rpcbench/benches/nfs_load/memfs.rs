//! The in-memory filesystem nfsserve is measured with (nfsserve ships none):
//! flat maps, enough for the benchmark's calls.

use std::collections::BTreeMap;
use std::sync::RwLock;

use async_trait::async_trait;
use nfsserve::nfs::{
    fattr3, fileid3, filename3, ftype3, nfspath3, nfsstat3, nfstime3, sattr3, set_size3,
};
use nfsserve::vfs::{DirEntry, NFSFileSystem, ReadDirResult, VFSCapabilities};

struct Node {
    parent: fileid3,
    dir: bool,
    data: Vec<u8>,
    children: BTreeMap<Vec<u8>, fileid3>,
}

pub struct MemFs {
    nodes: RwLock<BTreeMap<fileid3, Node>>,
    next: RwLock<fileid3>,
}

const ROOT: fileid3 = 1;

impl MemFs {
    pub fn new() -> MemFs {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            ROOT,
            Node {
                parent: ROOT,
                dir: true,
                data: Vec::new(),
                children: BTreeMap::new(),
            },
        );
        MemFs {
            nodes: RwLock::new(nodes),
            next: RwLock::new(ROOT + 1),
        }
    }

    /// Adds a file or directory under `parent`; returns its id.
    pub fn add(&self, parent: fileid3, name: &str, dir: bool, data: Vec<u8>) -> fileid3 {
        let id = {
            let mut next = self.next.write().unwrap();
            *next += 1;
            *next
        };
        let mut nodes = self.nodes.write().unwrap();
        nodes.insert(
            id,
            Node {
                parent,
                dir,
                data,
                children: BTreeMap::new(),
            },
        );
        nodes
            .get_mut(&parent)
            .unwrap()
            .children
            .insert(name.as_bytes().to_vec(), id);
        id
    }

    pub fn root(&self) -> fileid3 {
        ROOT
    }

    fn attr(id: fileid3, n: &Node) -> fattr3 {
        let t = nfstime3 {
            seconds: 1_700_000_000,
            nseconds: 0,
        };
        fattr3 {
            ftype: if n.dir {
                ftype3::NF3DIR
            } else {
                ftype3::NF3REG
            },
            mode: if n.dir { 0o755 } else { 0o644 },
            nlink: 1,
            fileid: id,
            size: n.data.len() as u64,
            used: n.data.len() as u64,
            atime: t,
            mtime: t,
            ctime: t,
            ..Default::default()
        }
    }
}

#[async_trait]
impl NFSFileSystem for MemFs {
    fn capabilities(&self) -> VFSCapabilities {
        VFSCapabilities::ReadWrite
    }
    fn root_dir(&self) -> fileid3 {
        ROOT
    }
    async fn lookup(&self, dirid: fileid3, filename: &filename3) -> Result<fileid3, nfsstat3> {
        let nodes = self.nodes.read().unwrap();
        let dir = nodes.get(&dirid).ok_or(nfsstat3::NFS3ERR_STALE)?;
        match filename.0.as_slice() {
            b"." => Ok(dirid),
            b".." => Ok(dir.parent),
            name => dir
                .children
                .get(name)
                .copied()
                .ok_or(nfsstat3::NFS3ERR_NOENT),
        }
    }
    async fn getattr(&self, id: fileid3) -> Result<fattr3, nfsstat3> {
        let nodes = self.nodes.read().unwrap();
        nodes
            .get(&id)
            .map(|n| Self::attr(id, n))
            .ok_or(nfsstat3::NFS3ERR_STALE)
    }
    async fn setattr(&self, id: fileid3, setattr: sattr3) -> Result<fattr3, nfsstat3> {
        let mut nodes = self.nodes.write().unwrap();
        let n = nodes.get_mut(&id).ok_or(nfsstat3::NFS3ERR_STALE)?;
        if let set_size3::size(size) = setattr.size {
            n.data.resize(size as usize, 0);
        }
        Ok(Self::attr(id, n))
    }
    async fn read(
        &self,
        id: fileid3,
        offset: u64,
        count: u32,
    ) -> Result<(Vec<u8>, bool), nfsstat3> {
        let nodes = self.nodes.read().unwrap();
        let n = nodes.get(&id).ok_or(nfsstat3::NFS3ERR_STALE)?;
        let start = (offset as usize).min(n.data.len());
        let end = (start + count as usize).min(n.data.len());
        Ok((n.data[start..end].to_vec(), end == n.data.len()))
    }
    async fn write(&self, id: fileid3, offset: u64, data: &[u8]) -> Result<fattr3, nfsstat3> {
        let mut nodes = self.nodes.write().unwrap();
        let n = nodes.get_mut(&id).ok_or(nfsstat3::NFS3ERR_STALE)?;
        let end = offset as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[offset as usize..end].copy_from_slice(data);
        Ok(Self::attr(id, n))
    }
    async fn create(
        &self,
        dirid: fileid3,
        filename: &filename3,
        _attr: sattr3,
    ) -> Result<(fileid3, fattr3), nfsstat3> {
        let name = std::str::from_utf8(&filename.0).map_err(|_| nfsstat3::NFS3ERR_INVAL)?;
        let id = self.add(dirid, name, false, Vec::new());
        Ok((id, self.getattr(id).await?))
    }
    async fn create_exclusive(
        &self,
        dirid: fileid3,
        filename: &filename3,
    ) -> Result<fileid3, nfsstat3> {
        Ok(self.create(dirid, filename, sattr3::default()).await?.0)
    }
    async fn mkdir(
        &self,
        dirid: fileid3,
        dirname: &filename3,
    ) -> Result<(fileid3, fattr3), nfsstat3> {
        let name = std::str::from_utf8(&dirname.0).map_err(|_| nfsstat3::NFS3ERR_INVAL)?;
        let id = self.add(dirid, name, true, Vec::new());
        Ok((id, self.getattr(id).await?))
    }
    async fn remove(&self, dirid: fileid3, filename: &filename3) -> Result<(), nfsstat3> {
        let mut nodes = self.nodes.write().unwrap();
        let dir = nodes.get_mut(&dirid).ok_or(nfsstat3::NFS3ERR_STALE)?;
        let id = dir
            .children
            .remove(filename.0.as_slice())
            .ok_or(nfsstat3::NFS3ERR_NOENT)?;
        nodes.remove(&id);
        Ok(())
    }
    async fn rename(
        &self,
        from_dir: fileid3,
        from: &filename3,
        to_dir: fileid3,
        to: &filename3,
    ) -> Result<(), nfsstat3> {
        let mut nodes = self.nodes.write().unwrap();
        let id = nodes
            .get_mut(&from_dir)
            .ok_or(nfsstat3::NFS3ERR_STALE)?
            .children
            .remove(from.0.as_slice())
            .ok_or(nfsstat3::NFS3ERR_NOENT)?;
        let target = nodes.get_mut(&to_dir).ok_or(nfsstat3::NFS3ERR_STALE)?;
        if let Some(replaced) = target.children.insert(to.0.to_vec(), id) {
            nodes.remove(&replaced);
        }
        if let Some(n) = nodes.get_mut(&id) {
            n.parent = to_dir;
        }
        Ok(())
    }
    async fn readdir(
        &self,
        dirid: fileid3,
        start_after: fileid3,
        max_entries: usize,
    ) -> Result<ReadDirResult, nfsstat3> {
        let nodes = self.nodes.read().unwrap();
        let dir = nodes.get(&dirid).ok_or(nfsstat3::NFS3ERR_STALE)?;
        let mut ids: Vec<(fileid3, &Vec<u8>)> =
            dir.children.iter().map(|(n, id)| (*id, n)).collect();
        ids.sort();
        let rest: Vec<_> = ids
            .into_iter()
            .filter(|(id, _)| *id > start_after)
            .collect();
        let entries = rest
            .iter()
            .take(max_entries)
            .map(|(id, name)| DirEntry {
                fileid: *id,
                name: nfsserve::nfs::nfsstring(name.to_vec()),
                attr: Self::attr(*id, &nodes[id]),
            })
            .collect::<Vec<_>>();
        Ok(ReadDirResult {
            end: entries.len() == rest.len(),
            entries,
        })
    }
    async fn symlink(
        &self,
        _: fileid3,
        _: &filename3,
        _: &nfspath3,
        _: &sattr3,
    ) -> Result<(fileid3, fattr3), nfsstat3> {
        Err(nfsstat3::NFS3ERR_NOTSUPP)
    }
    async fn readlink(&self, _: fileid3) -> Result<nfspath3, nfsstat3> {
        Err(nfsstat3::NFS3ERR_NOTSUPP)
    }
}
