//! [`LocalFs`]: the [`Filesystem`] over one host directory.
//!
//! Files are known by their host inode numbers. A table maps each id the
//! server has handed out to its parent and name; directories are reached
//! through cached descriptors opened component by component with `O_NOFOLLOW`,
//! so neither a client's names nor symlinks inside the export lead outside it.
//! Every operation is an `*at` call on a parent descriptor. An id the table
//! does not know (after a restart) is found again by walking the export once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::access::{self, Caller};
use crate::attr::{Attr, Change, FileKind, SetAttr, Timestamp};
use crate::error::{Error, Result};
use crate::fs::{Create, DirPage, Filesystem, FsStat, NewEntry, ReadSource, Stability};
use crate::FileId;

mod listing;

use crate::hostdir::{
    self, check_name, check_setattr, creatable, cstr, list, removable, sticky_allows, Host,
};
use listing::Listings;

/// Open descriptors kept per kind; past this the cache starts over.
const FD_CACHE: usize = 512;
/// Locks that serialise changes (and their before/after attributes) per id.
const STRIPES: usize = 64;
/// Ids known to be gone that are kept; past this the set starts over.
const GONE_KEPT: usize = 65_536;

#[derive(Clone)]
struct Node {
    parent: FileId,
    name: Box<[u8]>,
}

pub struct LocalFs {
    host: Host,
    root: Arc<OwnedFd>,
    root_id: FileId,
    nodes: RwLock<HashMap<FileId, Node>>,
    listings: Listings,
    /// Ids removed here or not found by a walk, answered STALE at once.
    gone: Mutex<HashSet<FileId>>,
    /// Walks of the export made to find an id (for tests).
    walks: AtomicU64,
    dirs: Mutex<HashMap<FileId, Arc<OwnedFd>>>,
    files: Mutex<HashMap<FileId, Arc<OwnedFd>>>,
    stripes: Vec<Mutex<()>>,
}

impl LocalFs {
    pub fn open(dir: &Path) -> Result<LocalFs> {
        let root = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // Up to FD_CACHE directories and as many files stay open.
        hostdir::raise_fd_limit();
        let host = Host::for_dir(root.as_fd());
        let attr = host.stats.fd(root.as_fd())?;
        Ok(LocalFs {
            host,
            root: Arc::new(root),
            root_id: attr.fileid,
            nodes: RwLock::new(HashMap::new()),
            listings: Listings::default(),
            gone: Mutex::new(HashSet::new()),
            walks: AtomicU64::new(0),
            dirs: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        })
    }

    fn lock(&self, id: FileId) -> MutexGuard<'_, ()> {
        self.stripes[(id % STRIPES as u64) as usize]
            .lock()
            .expect("stripe poisoned")
    }

    /// Locks two ids' stripes in a fixed order (once if they share one).
    fn lock_two(&self, a: FileId, b: FileId) -> (MutexGuard<'_, ()>, Option<MutexGuard<'_, ()>>) {
        let (sa, sb) = (a % STRIPES as u64, b % STRIPES as u64);
        if sa == sb {
            return (self.lock(a), None);
        }
        let (first, second) = if sa < sb { (a, b) } else { (b, a) };
        let g1 = self.lock(first);
        (g1, Some(self.lock(second)))
    }

    fn node(&self, id: FileId) -> Result<Node> {
        if let Some(node) = self.nodes.read().expect("nodes poisoned").get(&id) {
            return Ok(node.clone());
        }
        // A client keeps asking about files it removed (stale handles): answer
        // those without walking the whole export each time.
        if self.gone.lock().expect("gone poisoned").contains(&id) {
            return Err(Error::Stale);
        }
        self.find(id)
    }

    /// Records that `id` no longer names a file here.
    fn mark_gone(&self, id: FileId) {
        let mut gone = self.gone.lock().expect("gone poisoned");
        if gone.len() >= GONE_KEPT {
            gone.clear();
        }
        gone.insert(id);
    }

    fn remember(&self, parent: FileId, name: &[u8], attr: &Attr) {
        if attr.fileid == self.root_id {
            return;
        }
        self.gone
            .lock()
            .expect("gone poisoned")
            .remove(&attr.fileid);
        let mut nodes = self.nodes.write().expect("nodes poisoned");
        nodes.insert(
            attr.fileid,
            Node {
                parent,
                name: name.into(),
            },
        );
    }

    fn forget(&self, id: FileId) {
        self.mark_gone(id);
        self.nodes.write().expect("nodes poisoned").remove(&id);
        self.dirs.lock().expect("dirs poisoned").remove(&id);
        self.files.lock().expect("files poisoned").remove(&id);
    }

    /// Walks the export breadth first, remembering what it passes, until it
    /// meets `id`. Used for ids handed out before a restart.
    fn find(&self, id: FileId) -> Result<Node> {
        self.walks.fetch_add(1, Relaxed);
        let mut queue = VecDeque::from([self.root_id]);
        while let Some(dir) = queue.pop_front() {
            let Ok(fd) = self.dir_fd(dir) else { continue };
            let Ok(entries) = list(fd.as_fd()) else {
                continue;
            };
            for (name, ino, is_dir) in entries {
                let node = Node {
                    parent: dir,
                    name: name.into(),
                };
                self.nodes
                    .write()
                    .expect("nodes poisoned")
                    .insert(ino, node.clone());
                if ino == id {
                    return Ok(node);
                }
                if is_dir {
                    queue.push_back(ino);
                }
            }
        }
        self.mark_gone(id);
        Err(Error::Stale)
    }

    /// A descriptor of directory `id`.
    fn dir_fd(&self, id: FileId) -> Result<Arc<OwnedFd>> {
        if id == self.root_id {
            return Ok(self.root.clone());
        }
        if let Some(fd) = self.dirs.lock().expect("dirs poisoned").get(&id) {
            return Ok(fd.clone());
        }
        let node = self.node(id)?;
        let parent = self.dir_fd(node.parent)?;
        let fd = hostdir::open_dir(parent.as_fd(), &cstr(&node.name)?).map_err(|e| match e {
            // The id names something that is not a directory, or is gone.
            Errno::NOTDIR | Errno::LOOP => match self.host.stats.at(parent.as_fd(), &node.name[..])
            {
                Ok(attr) if attr.fileid == id => Error::NotDir,
                _ => Error::Stale,
            },
            Errno::NOENT => Error::Stale,
            e => e.into(),
        })?;
        if self.host.stats.fd(fd.as_fd())?.fileid != id {
            return Err(Error::Stale);
        }
        let fd = Arc::new(fd);
        let mut dirs = self.dirs.lock().expect("dirs poisoned");
        if dirs.len() >= FD_CACHE {
            dirs.clear();
        }
        dirs.insert(id, fd.clone());
        Ok(fd)
    }

    /// The parent descriptor and name of `id`, checked to still name it.
    fn entry(&self, id: FileId) -> Result<(Arc<OwnedFd>, CString, Attr)> {
        let node = self.node(id)?;
        let parent = self.dir_fd(node.parent)?;
        let name = cstr(&node.name)?;
        match self.host.stats.at(parent.as_fd(), &name) {
            Ok(attr) if attr.fileid == id => Ok((parent, name, attr)),
            _ => {
                // Renamed or removed behind our back: look for it once more.
                self.nodes.write().expect("nodes poisoned").remove(&id);
                let node = self.find(id)?;
                let parent = self.dir_fd(node.parent)?;
                let name = cstr(&node.name)?;
                let attr = self.host.stats.at(parent.as_fd(), &name)?;
                Ok((parent, name, attr))
            }
        }
    }

    /// A descriptor for reading and writing the regular file `id`.
    fn file_fd(&self, id: FileId) -> Result<Arc<OwnedFd>> {
        if let Some(fd) = self.files.lock().expect("files poisoned").get(&id) {
            return Ok(fd.clone());
        }
        let (parent, name, attr) = self.entry(id)?;
        match attr.kind {
            FileKind::Regular => {}
            FileKind::Directory => return Err(Error::IsDir),
            _ => return Err(Error::Inval),
        }
        let fd = Arc::new(hostdir::open_file(parent.as_fd(), &name)?);
        let mut files = self.files.lock().expect("files poisoned");
        if files.len() >= FD_CACHE {
            files.clear();
        }
        files.insert(id, fd.clone());
        Ok(fd)
    }

    /// The open file `id` and its attributes, if `caller` may read it. The
    /// owner may read its own file whatever the mode: NFS checks at open on
    /// the client, and a file created read-only is still written.
    fn readable(&self, caller: &Caller, id: FileId) -> Result<(Arc<OwnedFd>, Attr)> {
        let fd = self.file_fd(id)?;
        let attr = self.host.stats.fd(fd.as_fd())?;
        if caller.uid != attr.uid && !access::permits(&attr, caller, 4) {
            return Err(Error::Access);
        }
        Ok((fd, attr))
    }

    fn dir_attr(&self, dir: &OwnedFd) -> Result<Attr> {
        let attr = self.host.stats.fd(dir.as_fd())?;
        if attr.kind != FileKind::Directory {
            return Err(Error::NotDir);
        }
        Ok(attr)
    }

    /// Opens `dir` for adding or removing entries: checks write and search
    /// permission and returns its descriptor and attributes before the change.
    fn dir_for_change(&self, caller: &Caller, dir: FileId) -> Result<(Arc<OwnedFd>, Attr)> {
        let fd = self.dir_fd(dir)?;
        let attr = self.dir_attr(&fd)?;
        if !access::permits(&attr, caller, 2 | 1) {
            return Err(Error::Access);
        }
        Ok((fd, attr))
    }

    fn change(&self, fd: &OwnedFd, before: &Attr) -> Change {
        Change {
            before: Some(before.wcc()),
            after: self.host.stats.fd(fd.as_fd()).ok(),
        }
    }
}

impl Filesystem for LocalFs {
    fn root(&self) -> FileId {
        self.root_id
    }

    fn getattr(&self, id: FileId) -> Result<Attr> {
        if id == self.root_id {
            return self.host.stats.fd(self.root.as_fd());
        }
        if let Some(fd) = self.dirs.lock().expect("dirs poisoned").get(&id).cloned() {
            return self.host.stats.fd(fd.as_fd());
        }
        Ok(self.entry(id)?.2)
    }

    fn setattr(
        &self,
        caller: &Caller,
        id: FileId,
        set: &SetAttr,
        guard: Option<Timestamp>,
    ) -> Result<Change> {
        let _guard = self.lock(id);
        let (parent, name, before) = if id == self.root_id {
            (
                self.root.clone(),
                CString::new(".").expect("no NUL"),
                self.host.stats.fd(self.root.as_fd())?,
            )
        } else {
            self.entry(id)?
        };
        if guard.is_some_and(|ctime| ctime != before.ctime) {
            return Err(Error::NotSync);
        }
        check_setattr(caller, &before, set)?;
        let after = self.host.change(parent.as_fd(), &name, &before, set)?;
        Ok(Change {
            before: Some(before.wcc()),
            after: Some(after),
        })
    }

    fn lookup(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        let fd = self.dir_fd(dir)?;
        let dir_attr = self.dir_attr(&fd)?;
        if !access::permits(&dir_attr, caller, 1) {
            return Err(Error::Access);
        }
        match name {
            b"." => return Ok(dir_attr),
            b".." if dir == self.root_id => return Ok(dir_attr),
            b".." => return self.getattr(self.node(dir)?.parent),
            _ => {}
        }
        let attr = self.host.stats.at(fd.as_fd(), &cstr(name)?)?;
        self.remember(dir, name, &attr);
        Ok(attr)
    }

    fn readlink(&self, caller: &Caller, id: FileId) -> Result<Vec<u8>> {
        let (parent, name, attr) = self.entry(id)?;
        if attr.kind != FileKind::Symlink {
            return Err(Error::Inval);
        }
        let _ = caller;
        Ok(rustix::fs::readlinkat(&*parent, name.as_c_str(), Vec::new())?.into_bytes())
    }

    fn read_source(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        count: usize,
    ) -> Result<Option<ReadSource>> {
        let (file, attr) = self.readable(caller, id)?;
        Ok(Some(hostdir::read_source(file, attr, offset, count)))
    }

    fn read(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        count: usize,
        dst: &mut Vec<u8>,
    ) -> Result<(bool, Attr)> {
        let (fd, attr) = self.readable(caller, id)?;
        hostdir::read(fd.as_fd(), attr, offset, count, dst)
    }

    fn write(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        data: &[u8],
        stable: Stability,
    ) -> Result<(Change, Stability)> {
        let fd = self.file_fd(id)?;
        let _guard = self.lock(id);
        let before = self.host.stats.fd(fd.as_fd())?;
        if caller.uid != before.uid && !access::permits(&before, caller, 2) {
            return Err(Error::Access);
        }
        hostdir::write_at(fd.as_fd(), offset, data, stable)?;
        Ok((self.change(&fd, &before), stable))
    }

    fn commit(&self, id: FileId) -> Result<Change> {
        let fd = self.file_fd(id)?;
        let before = self.host.stats.fd(fd.as_fd())?;
        hostdir::sync_all(fd.as_fd())?;
        Ok(self.change(&fd, &before))
    }

    fn create(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        how: Create,
    ) -> Result<(Attr, Change)> {
        let cname = creatable(name)?;
        let (fd, before) = self.dir_for_change(caller, dir)?;
        let _guard = self.lock(dir);
        let attr = self.host.create(caller, fd.as_fd(), &before, &cname, how)?;
        self.remember(dir, name, &attr);
        Ok((attr, self.change(&fd, &before)))
    }

    fn make(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        what: NewEntry<'_>,
        set: &SetAttr,
    ) -> Result<(Attr, Change)> {
        let cname = creatable(name)?;
        let (fd, before) = self.dir_for_change(caller, dir)?;
        let _guard = self.lock(dir);
        let attr = self
            .host
            .make(caller, fd.as_fd(), &before, &cname, what, set)?;
        self.remember(dir, name, &attr);
        Ok((attr, self.change(&fd, &before)))
    }

    fn remove(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Change> {
        let cname = removable(name)?;
        let (fd, before) = self.dir_for_change(caller, dir)?;
        let _guard = self.lock(dir);
        let victim = self.host.stats.at(fd.as_fd(), &cname)?;
        sticky_allows(caller, &before, &victim)?;
        if victim.kind == FileKind::Directory {
            return Err(Error::IsDir);
        }
        rustix::fs::unlinkat(&*fd, cname.as_c_str(), AtFlags::empty())?;
        self.forget(victim.fileid);
        Ok(self.change(&fd, &before))
    }

    fn rmdir(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Change> {
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        let cname = removable(name)?;
        let (fd, before) = self.dir_for_change(caller, dir)?;
        let _guard = self.lock(dir);
        let victim = self.host.stats.at(fd.as_fd(), &cname)?;
        sticky_allows(caller, &before, &victim)?;
        if victim.kind != FileKind::Directory {
            return Err(Error::NotDir);
        }
        rustix::fs::unlinkat(&*fd, cname.as_c_str(), AtFlags::REMOVEDIR)?;
        self.forget(victim.fileid);
        Ok(self.change(&fd, &before))
    }

    fn rename(
        &self,
        caller: &Caller,
        from: FileId,
        from_name: &[u8],
        to: FileId,
        to_name: &[u8],
    ) -> Result<(Change, Change)> {
        let from_c = removable(from_name)?;
        let to_c = removable(to_name)?;
        let (from_fd, from_before) = self.dir_for_change(caller, from)?;
        let (to_fd, to_before) = self.dir_for_change(caller, to)?;
        let _guards = self.lock_two(from, to);
        let moving = self.host.stats.at(from_fd.as_fd(), &from_c)?;
        sticky_allows(caller, &from_before, &moving)?;
        let replaced = self.host.stats.at(to_fd.as_fd(), &to_c).ok();
        if let Some(target) = &replaced {
            sticky_allows(caller, &to_before, target)?;
        }
        rustix::fs::renameat(&*from_fd, from_c.as_c_str(), &*to_fd, to_c.as_c_str())?;
        if let Some(target) = replaced.filter(|t| t.fileid != moving.fileid) {
            self.forget(target.fileid);
        }
        self.remember(to, to_name, &moving);
        Ok((
            self.change(&from_fd, &from_before),
            self.change(&to_fd, &to_before),
        ))
    }

    fn link(
        &self,
        caller: &Caller,
        id: FileId,
        dir: FileId,
        name: &[u8],
    ) -> Result<(Attr, Change)> {
        let cname = creatable(name)?;
        let (src_parent, src_name, attr) = self.entry(id)?;
        if attr.kind == FileKind::Directory {
            return Err(Error::IsDir);
        }
        let (fd, before) = self.dir_for_change(caller, dir)?;
        let _guard = self.lock(dir);
        rustix::fs::linkat(
            &*src_parent,
            src_name.as_c_str(),
            &*fd,
            cname.as_c_str(),
            AtFlags::empty(),
        )?;
        let attr = self.host.stats.at(fd.as_fd(), &cname)?;
        Ok((attr, self.change(&fd, &before)))
    }

    fn readdir(
        &self,
        caller: &Caller,
        dir: FileId,
        cookie: u64,
        max: usize,
        with_attrs: bool,
    ) -> Result<DirPage> {
        let fd = self.dir_fd(dir)?;
        let attr = self.dir_attr(&fd)?;
        if !access::permits(&attr, caller, 4) {
            return Err(Error::Access);
        }
        let parent = if dir == self.root_id {
            dir
        } else {
            self.node(dir)?.parent
        };
        let listing = self.listings.get(dir, &attr, fd.as_fd(), |fresh| {
            let mut nodes = self.nodes.write().expect("nodes poisoned");
            for e in fresh {
                nodes.insert(
                    e.fileid,
                    Node {
                        parent: dir,
                        name: e.name.clone(),
                    },
                );
            }
        })?;
        let named = listing[listing.partition_point(|e| e.cookie <= cookie)..]
            .iter()
            .map(|e| (e.fileid, &e.name[..], e.cookie));
        let mut page = DirPage::after(dir, parent, cookie, max, named);
        if with_attrs {
            for e in &mut page.entries {
                e.attr = match e.cookie {
                    1 => Some(attr),
                    2 => self.getattr(parent).ok(),
                    _ => self.host.stats.at(fd.as_fd(), &e.name[..]).ok(),
                };
            }
        }
        Ok(page)
    }

    fn fsstat(&self, _id: FileId) -> Result<FsStat> {
        hostdir::fsstat(self.root.as_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_files_id_is_stale_without_walking_the_export() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..50 {
            std::fs::write(dir.path().join(format!("f{i}")), b"").unwrap();
        }
        let fs = LocalFs::open(dir.path()).unwrap();
        let root = fs.root();
        let id = fs.lookup(&Caller::root(), root, b"f7").unwrap().fileid;
        fs.remove(&Caller::root(), root, b"f7").unwrap();
        for _ in 0..100 {
            assert_eq!(fs.getattr(id), Err(Error::Stale));
        }
        assert_eq!(fs.walks.load(Relaxed), 0);
        // An id never seen is looked for once, then known to be gone.
        for _ in 0..100 {
            assert_eq!(fs.getattr(u64::MAX - 1), Err(Error::Stale));
        }
        assert_eq!(fs.walks.load(Relaxed), 1);
        // A new file that reuses an id is found again.
        let again = fs
            .create(
                &Caller::root(),
                root,
                b"new",
                Create::Unchecked(SetAttr::default()),
            )
            .unwrap()
            .0;
        assert_eq!(fs.getattr(again.fileid).unwrap().fileid, again.fileid);
    }
}
