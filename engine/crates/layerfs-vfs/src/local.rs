//! [`LocalFs`]: the [`Filesystem`] over one host directory.
//!
//! Files are known by their host inode numbers. A table maps each id the
//! server has handed out to its parent and name; directories are reached
//! through cached descriptors opened component by component with `O_NOFOLLOW`,
//! so neither a client's names nor symlinks inside the export lead outside it.
//! Every operation is an `*at` call on a parent descriptor. An id the table
//! does not know (after a restart) is found again by walking the export once.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::access::{self, Caller, Perm};
use crate::attr::{Attr, Change, FileKind, SetAttr, Timestamp};
use crate::error::{Error, Result};
use crate::fs::{
    Allocate, Create, DirPage, Filesystem, FsStat, Hints, HostFiles, KeptFile, NewEntry,
    ReadSource, Stability,
};
use crate::ids::{IdTable, Place, Seen};
use crate::stripes::Stripes;
use crate::FileId;

mod kept_open;
mod listing;
mod places;

use crate::hostdir::{
    self, check_name, check_setattr, creatable, cstr, list, may_change_entries, may_rename,
    removable, sticky_allows, Host,
};
use kept_open::KeptOpen;
use listing::Listings;
use places::DirPlaces;

pub struct LocalFs {
    host: Host,
    root: Arc<OwnedFd>,
    root_id: FileId,
    root_generation: u64,
    ids: IdTable,
    /// Directories' ids, where the host does not keep inode numbers.
    places: Option<DirPlaces>,
    listings: Listings,
    dirs: KeptOpen,
    files: KeptOpen,
    /// Serialise changes per id, with their before and after attributes.
    stripes: Stripes,
}

impl LocalFs {
    pub fn open(dir: &Path) -> Result<LocalFs> {
        let root = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // Up to kept_open::KEPT_OPEN directories and as many files stay open.
        hostdir::raise_fd_limit();
        let host = Host::for_dir(root.as_fd());
        let root_attr = host.stats.fd(root.as_fd())?;
        let (root_id, places) = if host.stats.keeps_inode_numbers() {
            (root_attr.fileid, None)
        } else {
            tracing::info!(
                "{}: this filesystem does not keep inode numbers; directories get ids by place",
                dir.display()
            );
            (places::ROOT, Some(DirPlaces::default()))
        };
        Ok(LocalFs {
            host,
            root: Arc::new(root),
            root_id,
            root_generation: root_attr.generation,
            ids: IdTable::new(root_id),
            places,
            listings: Listings::default(),
            dirs: KeptOpen::default(),
            files: KeptOpen::default(),
            stripes: Stripes::default(),
        })
    }

    /// `attr`, read from the entry `name` of `parent`, with the id it has here.
    fn named(&self, parent: FileId, name: &[u8], mut attr: Attr) -> Attr {
        if let (Some(places), FileKind::Directory) = (&self.places, attr.kind) {
            attr.fileid = self.place_id(places, parent, name);
        }
        attr
    }

    /// The id of the directory `name` in `parent`, given by its place.
    fn place_id(&self, places: &DirPlaces, parent: FileId, name: &[u8]) -> FileId {
        places.id(parent, name, |id| {
            self.ids.is_gone(id)
                || self
                    .ids
                    .get(id)
                    .is_some_and(|p| p.parent != parent || *p.name != *name)
        })
    }

    /// `attr`, read from an open descriptor of `id`, with that id.
    fn own(&self, id: FileId, mut attr: Attr) -> Attr {
        if self.places.is_some() && attr.kind == FileKind::Directory {
            attr.fileid = id;
        }
        attr
    }

    fn stat_at(&self, parent: FileId, fd: &OwnedFd, name: &[u8]) -> Result<Attr> {
        // rustix makes the C string on the stack (names are at most 255
        // bytes), and refuses a NUL in it as EINVAL, as `cstr` would.
        let attr = self.host.stats.at(fd.as_fd(), name)?;
        Ok(self.named(parent, name, attr))
    }

    /// Whether `caller` may add `name` to `dir` (open as `fd`, with the
    /// attributes `before`), answered as a local kernel answers: where it may
    /// not, an existing name is EEXIST, not EACCES. The name is looked up
    /// only then; where it may, the host's own EEXIST answers.
    fn may_add(
        &self,
        caller: &Caller,
        dir: FileId,
        fd: &OwnedFd,
        before: &Attr,
        name: &[u8],
    ) -> Result<()> {
        may_change_entries(caller, before).map_err(|denied| match self.stat_at(dir, fd, name) {
            Ok(_) => Error::Exist,
            Err(_) => denied,
        })
    }

    fn stat_fd(&self, id: FileId, fd: &OwnedFd) -> Result<Attr> {
        Ok(self.own(id, self.host.stats.fd(fd.as_fd())?))
    }

    /// The entries of directory `dir` (open as `fd`) with their ids.
    fn entries(&self, dir: FileId, fd: &OwnedFd) -> Result<Vec<Seen>> {
        let listed = list(fd.as_fd())?.into_iter();
        let Some(places) = &self.places else {
            return Ok(listed
                .map(|(name, id, is_dir)| Seen {
                    name: name.into(),
                    id,
                    is_dir,
                })
                .collect());
        };
        // A directory's id is its place's; another file's needs its device.
        Ok(listed
            .filter_map(|(name, _, is_dir)| {
                let id = match is_dir {
                    true => self.place_id(places, dir, &name),
                    false => self.stat_at(dir, fd, &name).ok()?.fileid,
                };
                Some(Seen {
                    name: name.into(),
                    id,
                    is_dir,
                })
            })
            .collect())
    }

    fn place(&self, id: FileId) -> Result<Place> {
        self.ids.place(id, |dir| {
            let fd = self.dir_fd(dir)?;
            self.entries(dir, &fd)
        })
    }

    fn remember(&self, parent: FileId, name: &[u8], attr: &Attr) {
        self.ids.remember(parent, name, attr.fileid);
    }

    /// `name` in `parent`, which named `victim`, is gone.
    fn unlinked(&self, parent: FileId, name: &[u8], victim: &Attr) {
        let links_left = match victim.kind {
            FileKind::Directory => 0,
            _ => victim.nlink.saturating_sub(1),
        };
        self.ids.unlinked(parent, name, victim.fileid, links_left);
        // A file's descriptor may have been opened through this name: its
        // writes would notify this directory, not one the file is still in.
        self.files.forget(victim.fileid);
        if links_left == 0 {
            self.dirs.forget(victim.fileid);
        }
        if let (Some(places), FileKind::Directory) = (&self.places, victim.kind) {
            places.removed(parent, name);
        }
    }

    /// A descriptor of directory `id`.
    fn dir_fd(&self, id: FileId) -> Result<Arc<OwnedFd>> {
        if id == self.root_id {
            return Ok(self.root.clone());
        }
        if let Some(fd) = self.dirs.fd(id) {
            return Ok(fd);
        }
        let node = self.place(id)?;
        let parent = self.dir_fd(node.parent)?;
        let fd = hostdir::open_dir(parent.as_fd(), &cstr(&node.name)?).map_err(|e| match e {
            // The id names something that is not a directory, or is gone.
            Errno::NOTDIR | Errno::LOOP => match self.stat_at(node.parent, &parent, &node.name) {
                Ok(attr) if attr.fileid == id => Error::NotDir,
                _ => Error::Stale,
            },
            Errno::NOENT => Error::Stale,
            e => e.into(),
        })?;
        let attr = self.stat_fd(id, &fd)?;
        if attr.fileid != id {
            return Err(Error::Stale);
        }
        let fd = Arc::new(fd);
        self.dirs.keep(id, fd.clone(), attr.generation);
        Ok(fd)
    }

    /// The parent descriptor and place of `id`, with its attributes,
    /// checked to still name it.
    fn placed(&self, id: FileId) -> Result<(Arc<OwnedFd>, Place, Attr)> {
        let node = self.place(id)?;
        let parent = self.dir_fd(node.parent)?;
        match self.stat_at(node.parent, &parent, &node.name) {
            Ok(attr) if attr.fileid == id => Ok((parent, node, attr)),
            _ => {
                // Renamed or removed behind our back: look for it once more.
                self.ids.lost(id);
                let node = self.place(id)?;
                let parent = self.dir_fd(node.parent)?;
                let attr = self.stat_at(node.parent, &parent, &node.name)?;
                Ok((parent, node, attr))
            }
        }
    }

    /// [`LocalFs::placed`], with the name ready for the host's calls.
    fn entry(&self, id: FileId) -> Result<(Arc<OwnedFd>, CString, Attr)> {
        let (parent, node, attr) = self.placed(id)?;
        Ok((parent, cstr(&node.name)?, attr))
    }

    /// A descriptor for reading and writing the regular file `id`.
    fn file_fd(&self, id: FileId) -> Result<Arc<OwnedFd>> {
        if let Some(fd) = self.files.fd(id) {
            return Ok(fd);
        }
        let (parent, name, attr) = self.entry(id)?;
        match attr.kind {
            FileKind::Regular => {}
            FileKind::Directory => return Err(Error::IsDir),
            _ => return Err(Error::Inval),
        }
        let fd = Arc::new(hostdir::open_file(parent.as_fd(), &name)?);
        self.files.keep(id, fd.clone(), attr.generation);
        Ok(fd)
    }

    /// The attributes of `id`, open as `fd`: `Stale` once it has no name
    /// left (removed on the host while it was open here), or when `fd` is
    /// not the file `id` names.
    fn open_file_attr(&self, id: FileId, fd: &OwnedFd) -> Result<Attr> {
        let attr = self.host.stats.fd(fd.as_fd())?;
        if attr.nlink == 0 || attr.fileid != id {
            self.files.forget(id);
            return Err(Error::Stale);
        }
        Ok(attr)
    }

    /// The open file `id` and its attributes, if `caller` may read it. The
    /// owner may read its own file whatever the mode: NFS checks at open on
    /// the client, and a file created read-only is still written.
    fn readable(&self, caller: &Caller, id: FileId) -> Result<(Arc<OwnedFd>, Attr)> {
        let fd = self.file_fd(id)?;
        let attr = self.host.stats.fd(fd.as_fd())?;
        if !access::owner_may(&attr, caller, Perm::READ) {
            return Err(Error::Access);
        }
        Ok((fd, attr))
    }

    /// Directory `dir`, open, and its attributes, if `caller` may search it.
    fn searchable(&self, caller: &Caller, dir: FileId) -> Result<(Arc<OwnedFd>, Attr)> {
        let fd = self.dir_fd(dir)?;
        let attr = self.stat_fd(dir, &fd)?;
        if attr.kind != FileKind::Directory {
            return Err(Error::NotDir);
        }
        if !access::permits(&attr, caller, Perm::EXEC) {
            return Err(Error::Access);
        }
        Ok((fd, attr))
    }

    fn change(&self, id: FileId, fd: &OwnedFd, before: &Attr) -> Change {
        Change {
            before: Some(before.before_change()),
            after: self.stat_fd(id, fd).ok(),
        }
    }
}

impl Filesystem for LocalFs {
    fn root(&self) -> FileId {
        self.root_id
    }

    fn hints(&self) -> &dyn Hints {
        self
    }

    fn host_files(&self) -> Option<&dyn HostFiles> {
        Some(self)
    }

    fn getattr(&self, id: FileId) -> Result<Attr> {
        if id == self.root_id {
            return self.stat_fd(id, &self.root);
        }
        let kept = self.dirs.fd(id);
        if let Some(fd) = kept {
            return self.stat_fd(id, &fd);
        }
        Ok(self.placed(id)?.2)
    }

    /// A file kept open is checked again when it is used: one removed on
    /// the host meanwhile is `Stale` then.
    fn still_names(&self, id: FileId, generation: u64) -> Result<()> {
        let kept = match id == self.root_id {
            true => Some(self.root_generation),
            false => {
                let dir = self.dirs.generation(id);
                dir.or_else(|| self.files.generation(id))
            }
        };
        match kept {
            Some(kept) if kept == generation => Ok(()),
            Some(_) => Err(Error::Stale),
            None => self.check_generation(id, generation).map(drop),
        }
    }

    fn setattr(
        &self,
        caller: &Caller,
        id: FileId,
        set: &SetAttr,
        guard: Option<Timestamp>,
    ) -> Result<Change> {
        let _guard = self.stripes.lock(id);
        let (parent, name, before) = if id == self.root_id {
            (
                self.root.clone(),
                CString::new(".").expect("no NUL"),
                self.stat_fd(id, &self.root)?,
            )
        } else {
            self.entry(id)?
        };
        if guard.is_some_and(|ctime| ctime != before.ctime) {
            return Err(Error::NotSync);
        }
        let set = check_setattr(caller, &before, set)?;
        let after = self.host.change(parent.as_fd(), &name, &before, &set)?;
        Ok(Change {
            before: Some(before.before_change()),
            after: Some(self.own(id, after)),
        })
    }

    fn lookup_in(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<(Result<Attr>, Attr)> {
        check_name(name)?;
        let (fd, dir_attr) = self.searchable(caller, dir)?;
        let found = match name {
            b"." => Ok(dir_attr),
            b".." if dir == self.root_id => Ok(dir_attr),
            b".." => self.place(dir).and_then(|place| self.getattr(place.parent)),
            _ => self.stat_at(dir, &fd, name).inspect(|attr| {
                self.remember(dir, name, attr);
            }),
        };
        Ok((found, dir_attr))
    }

    fn readlink(&self, caller: &Caller, id: FileId) -> Result<Vec<u8>> {
        let (parent, name, attr) = self.entry(id)?;
        if attr.kind != FileKind::Symlink {
            return Err(Error::Inval);
        }
        let _ = caller;
        Ok(rustix::fs::readlinkat(&*parent, name.as_c_str(), Vec::new())?.into_bytes())
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
        let _guard = self.stripes.lock(id);
        let before = self.open_file_attr(id, &fd)?;
        if !access::owner_may(&before, caller, Perm::WRITE) {
            return Err(Error::Access);
        }
        if let Some(mode) = hostdir::mode_after_write(caller, &before) {
            rustix::fs::fchmod(&*fd, hostdir::permissions(mode))?;
        }
        hostdir::write_at(fd.as_fd(), offset, data, stable)?;
        Ok((self.change(id, &fd, &before), stable))
    }

    fn allocate(&self, id: FileId, offset: u64, len: u64, how: Allocate) -> Result<Change> {
        let fd = self.file_fd(id)?;
        let _guard = self.stripes.lock(id);
        let before = self.open_file_attr(id, &fd)?;
        hostdir::allocate(fd.as_fd(), offset, len, how)?;
        Ok(self.change(id, &fd, &before))
    }

    fn commit(&self, id: FileId) -> Result<Change> {
        let file = if id == self.root_id {
            Err(Error::IsDir)
        } else {
            self.file_fd(id)
        };
        let fd = match file {
            // A directory's entries, as fsync(2) of a directory makes durable.
            Err(Error::IsDir) => {
                let dir = self.dir_fd(id)?;
                let before = self.stat_fd(id, &dir)?;
                hostdir::sync_all(dir.as_fd())?;
                return Ok(self.change(id, &dir, &before));
            }
            other => other?,
        };
        let _guard = self.stripes.lock(id);
        let before = self.open_file_attr(id, &fd)?;
        hostdir::sync_all(fd.as_fd())?;
        Ok(self.change(id, &fd, &before))
    }

    fn create(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        how: Create,
    ) -> Result<(Attr, Change)> {
        let cname = creatable(name)?;
        let _guard = self.stripes.lock(dir);
        let (fd, before) = self.searchable(caller, dir)?;
        if let Err(denied) = may_change_entries(caller, &before) {
            // UNCHECKED of an existing file changes only the file.
            let exists = self.stat_at(dir, &fd, name).is_ok();
            match how {
                Create::Unchecked(_) if exists => {}
                Create::Guarded(_) if exists => return Err(Error::Exist),
                _ => return Err(denied),
            }
        }
        let (attr, made) = self.host.create(caller, fd.as_fd(), &before, &cname, how)?;
        let attr = self.named(dir, name, attr);
        self.remember(dir, name, &attr);
        if let Some(file) = made {
            self.files
                .keep(attr.fileid, Arc::new(file), attr.generation);
        }
        Ok((attr, self.change(dir, &fd, &before)))
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
        let _guard = self.stripes.lock(dir);
        let (fd, before) = self.searchable(caller, dir)?;
        self.may_add(caller, dir, &fd, &before, name)?;
        let attr = self
            .host
            .make(caller, fd.as_fd(), &before, &cname, what, set)?;
        let attr = self.named(dir, name, attr);
        self.remember(dir, name, &attr);
        Ok((attr, self.change(dir, &fd, &before)))
    }

    fn remove(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Change> {
        let cname = removable(name)?;
        let _guard = self.stripes.lock(dir);
        let (fd, before) = self.searchable(caller, dir)?;
        let victim = self.stat_at(dir, &fd, name)?;
        may_change_entries(caller, &before)?;
        sticky_allows(caller, &before, &victim)?;
        if victim.kind == FileKind::Directory {
            return Err(Error::IsDir);
        }
        rustix::fs::unlinkat(&*fd, cname.as_c_str(), AtFlags::empty())?;
        self.unlinked(dir, name, &victim);
        Ok(self.change(dir, &fd, &before))
    }

    fn rmdir(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Change> {
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        let cname = removable(name)?;
        let _guard = self.stripes.lock(dir);
        let (fd, before) = self.searchable(caller, dir)?;
        let victim = self.stat_at(dir, &fd, name)?;
        may_change_entries(caller, &before)?;
        sticky_allows(caller, &before, &victim)?;
        if victim.kind != FileKind::Directory {
            return Err(Error::NotDir);
        }
        rustix::fs::unlinkat(&*fd, cname.as_c_str(), AtFlags::REMOVEDIR)?;
        self.unlinked(dir, name, &victim);
        Ok(self.change(dir, &fd, &before))
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
        let _guards = self.stripes.lock_two(from, to);
        let (from_fd, from_before) = self.searchable(caller, from)?;
        let (to_fd, to_before) = match to == from {
            true => (from_fd.clone(), from_before),
            false => self.searchable(caller, to)?,
        };
        let moving = self.stat_at(from, &from_fd, from_name)?;
        // Most renames replace nothing. Asked first to replace nothing, the
        // host looks the new name up once, not twice; where something has
        // it, that is read and checked as a replacement needs.
        let anew = may_rename(caller, (&from_before, &moving), (&to_before, None)).is_ok()
            && hostdir::rename_anew(from_fd.as_fd(), &from_c, to_fd.as_fd(), &to_c)?;
        let replaced = match anew {
            true => None,
            false => {
                let replaced = self.stat_at(to, &to_fd, to_name).ok();
                may_rename(
                    caller,
                    (&from_before, &moving),
                    (&to_before, replaced.as_ref()),
                )?;
                rustix::fs::renameat(&*from_fd, from_c.as_c_str(), &*to_fd, to_c.as_c_str())?;
                replaced
            }
        };
        if let Some(target) = replaced.filter(|t| t.fileid != moving.fileid) {
            self.unlinked(to, to_name, &target);
        }
        if let (Some(places), FileKind::Directory) = (&self.places, moving.kind) {
            places.moved((from, from_name), (to, to_name), moving.fileid);
        }
        self.remember(to, to_name, &moving);
        let from_change = self.change(from, &from_fd, &from_before);
        let to_change = match to == from {
            true => from_change,
            false => self.change(to, &to_fd, &to_before),
        };
        Ok((from_change, to_change))
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
        let _guard = self.stripes.lock(dir);
        let (fd, before) = self.searchable(caller, dir)?;
        self.may_add(caller, dir, &fd, &before, name)?;
        rustix::fs::linkat(
            &*src_parent,
            src_name.as_c_str(),
            &*fd,
            cname.as_c_str(),
            AtFlags::empty(),
        )?;
        // Its link count moved, which no notice tells its directory.
        if let Ok(src) = self.place(id) {
            self.listings.forget(src.parent, &src.name);
        }
        let attr = self.stat_at(dir, &fd, name)?;
        Ok((attr, self.change(dir, &fd, &before)))
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
        let attr = self.stat_fd(dir, &fd)?;
        if attr.kind != FileKind::Directory {
            return Err(Error::NotDir);
        }
        if !access::permits(&attr, caller, Perm::READ) {
            return Err(Error::Access);
        }
        let parent = if dir == self.root_id {
            dir
        } else {
            self.place(dir)?.parent
        };
        let listing = self.listings.get(dir, &attr, || {
            let entries = self.entries(dir, &fd)?;
            for e in &entries {
                self.ids.remember(dir, &e.name, e.id);
            }
            Ok(entries)
        })?;
        let first = listing.partition_point(|e| e.cookie <= cookie);
        let named = listing[first..]
            .iter()
            .map(|e| (e.fileid, &e.name[..], e.cookie));
        let mut page = DirPage::after(dir, attr, parent, cookie, max, named);
        if with_attrs {
            let dots = page.entries.iter().take_while(|e| e.cookie <= 2).count();
            let (dots, named) = page.entries.split_at_mut(dots);
            for e in dots {
                e.attr = match e.cookie {
                    1 => Some(attr),
                    _ => self.getattr(parent).ok(),
                };
            }
            self.listings
                .fill_attrs(dir, fd.as_fd(), &listing, first, named, |name| {
                    self.stat_at(dir, &fd, name).ok()
                });
        }
        Ok(page)
    }

    fn fsstat(&self, _id: FileId) -> Result<FsStat> {
        hostdir::fsstat(self.root.as_fd())
    }
}

impl Hints for LocalFs {
    fn knows(&self, id: FileId) -> bool {
        self.ids.knows(id)
    }

    fn lists_at_hand(&self, dir: FileId, with_attrs: bool) -> bool {
        self.listings.at_hand(dir, with_attrs)
    }
}

impl HostFiles for LocalFs {
    /// Every file of the directory is its own host file.
    fn host_file(&self, caller: &Caller, id: FileId, write: bool) -> Result<Option<Arc<OwnedFd>>> {
        let fd = self.file_fd(id)?;
        let attr = self.host.stats.fd(fd.as_fd())?;
        if !access::permits(
            &attr,
            caller,
            if write {
                Perm::READ | Perm::WRITE
            } else {
                Perm::READ
            },
        ) {
            return Err(Error::Access);
        }
        Ok(Some(fd))
    }

    fn file_to_keep(&self, id: FileId, _write: bool) -> Result<Option<KeptFile>> {
        self.file_fd(id).map(|fd| Some(KeptFile::whole(fd)))
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
        assert_eq!(fs.ids.walks(), 0);
        // An id never seen is looked for once, then known to be gone.
        for _ in 0..100 {
            assert_eq!(fs.getattr(u64::MAX - 1), Err(Error::Stale));
        }
        assert_eq!(fs.ids.walks(), 1);
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
