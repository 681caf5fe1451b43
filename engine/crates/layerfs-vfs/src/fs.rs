use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::access::Caller;
use crate::attr::{Attr, Change, FileKind, SetAttr, Timestamp};
use crate::error::{Error, Result};
use crate::FileId;

/// See [`HostFiles::read_source`].
#[derive(Clone, Debug)]
pub struct ReadSource {
    pub file: Arc<OwnedFd>,
    pub offset: u64,
    pub len: usize,
    pub eof: bool,
    pub attr: Attr,
}

/// Brings in a host file's data before it is read, for a filesystem whose
/// host files may not hold all of it yet (a lazy layer's).
pub trait Fill: Send + Sync {
    /// Makes the `len` bytes at `offset` of `file` what the filesystem
    /// serves there, or fails (`Io`) without a byte of it being read.
    fn fill(&self, file: BorrowedFd<'_>, offset: u64, len: u64) -> Result<()>;
}

/// A host file whose bytes are read only through it: each read brings in
/// first what a filesystem's [`Fill`] says is missing, so a file that is a
/// lazy layer's reads its data, never the host's holes. A door keeps one
/// for an open ([`HostFiles::file_to_keep`]); a filesystem reads its own
/// files through one.
#[derive(Clone)]
pub struct KeptFile {
    host: Arc<OwnedFd>,
    fill: Option<Arc<dyn Fill>>,
}

impl KeptFile {
    /// A host file that holds all its data.
    pub fn whole(host: Arc<OwnedFd>) -> KeptFile {
        KeptFile { host, fill: None }
    }

    /// A host file whose data `fill` brings in before each read.
    pub fn filled_by(host: Arc<OwnedFd>, fill: Arc<dyn Fill>) -> KeptFile {
        KeptFile {
            host,
            fill: Some(fill),
        }
    }

    /// The host file once the `len` bytes at `offset` are in: the one way
    /// to its bytes.
    fn filled(&self, offset: u64, len: u64) -> Result<BorrowedFd<'_>> {
        let file = self.host.as_fd();
        if let Some(fill) = &self.fill {
            fill.fill(file, offset, len)?;
        }
        Ok(file)
    }

    /// Up to `count` bytes at `offset`, as [`crate::hostdir::read`] reads
    /// them, after they are brought in.
    pub fn read(&self, offset: u64, count: usize, dst: &mut Vec<u8>) -> Result<(bool, Attr)> {
        let file = self.filled(offset, count as u64)?;
        crate::hostdir::read(file, crate::hostdir::host_attr(file)?, offset, count, dst)
    }

    /// [`KeptFile::read`] for a filesystem that shows the file as `attr`.
    pub fn read_shown(
        &self,
        attr: Attr,
        offset: u64,
        count: usize,
        dst: &mut Vec<u8>,
    ) -> Result<(bool, Attr)> {
        let file = self.filled(offset, count as u64)?;
        crate::hostdir::read(file, attr, offset, count, dst)
    }

    /// Where a door reads `count` bytes at `offset` itself
    /// ([`HostFiles::read_source`]), once they are in.
    pub fn read_source(&self, attr: Attr, offset: u64, count: usize) -> Result<ReadSource> {
        self.filled(offset, count as u64)?;
        Ok(crate::hostdir::read_source(
            self.host.clone(),
            attr,
            offset,
            count,
        ))
    }

    /// Up to `buf.len()` bytes at `offset` (fewer at the end), once in.
    pub fn pread(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let file = self.filled(offset, buf.len().max(1) as u64)?;
        Ok(rustix::io::pread(file, buf, offset)?)
    }

    /// The host file once its first `len` bytes are all in, for a copy the
    /// kernel makes of them (a clone, `copy_file_range`).
    pub fn all_in(&self, len: u64) -> Result<BorrowedFd<'_>> {
        self.filled(0, len)
    }

    /// The host descriptor of a file that holds all its data (made by
    /// [`KeptFile::whole`]): for writes, changes and a door's own reads of
    /// it. `None` for a file read through a fill, whose descriptor is never
    /// handed out: its bytes come only through the methods above.
    pub fn whole_host(&self) -> Option<&Arc<OwnedFd>> {
        match self.fill {
            None => Some(&self.host),
            Some(_) => None,
        }
    }

    /// The file's attributes as the host has them.
    pub fn host_attr(&self) -> Result<Attr> {
        crate::hostdir::host_attr(self.host.as_fd())
    }

    /// The file's attributes as `stats` shows the export's files.
    pub fn attr(&self, stats: &crate::hostdir::Stats) -> Result<Attr> {
        stats.fd(self.host.as_fd())
    }

    /// Extended attribute `name`, read into `value`'s spare room.
    pub fn get_xattr(&self, name: &std::ffi::OsStr, value: &mut Vec<u8>) -> Result<()> {
        let room = rustix::buffer::spare_capacity(value);
        rustix::fs::fgetxattr(&*self.host, name, room)?;
        Ok(())
    }

    /// Writes what the host holds of the file to its disk (its data alone
    /// with `data_only`).
    pub fn sync(&self, data_only: bool) -> Result<()> {
        match data_only {
            true => crate::hostdir::sync_data(self.host.as_fd()),
            false => crate::hostdir::sync_all(self.host.as_fd()),
        }
    }

    /// Gives the file the new name `name` in `dir` (through /proc: linking
    /// a descriptor itself needs `CAP_DAC_READ_SEARCH`, which a user's
    /// daemon lacks).
    pub fn link_into(&self, dir: BorrowedFd<'_>, name: &str) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let from = format!("/proc/self/fd/{}", self.host.as_raw_fd());
        rustix::fs::linkat(
            rustix::fs::CWD,
            from,
            dir,
            name,
            rustix::fs::AtFlags::SYMLINK_FOLLOW,
        )?;
        Ok(())
    }

    /// Whether `other` is this very open of the file (a clone of it).
    pub fn is(&self, other: &KeptFile) -> bool {
        Arc::ptr_eq(&self.host, &other.host)
    }
}

impl std::fmt::Debug for KeptFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptFile")
            .field("host", &self.host)
            .field("filled", &self.fill.is_some())
            .finish()
    }
}

/// What a door's opens hold, for a filesystem that keeps a file whose last
/// name is removed while it is open ([`HostFiles::hold_removed_for`]).
pub trait Holder: Send + Sync {
    /// The host file the opens of regular file `id` hold, if any, and
    /// whether they took it for writing. Its last name is about to be
    /// removed and the filesystem keeps it: the holder lets go of it at its
    /// last release ([`HostFiles::forget_removed`]). Asked in the middle of
    /// the removal: it must not call the filesystem.
    fn keep(&self, id: FileId) -> Option<(KeptFile, bool)>;
}

/// A file whose last name was removed while a door's opens held it, kept
/// for the next server of the door's session (see
/// [`HostFiles::hold_removed_for`]).
#[derive(Debug)]
pub struct RemovedFile {
    pub id: FileId,
    /// Opened for writing where `write`, else for reading.
    pub file: KeptFile,
    /// Whether the opens held it for writing: a file held only for reading
    /// may be a lower layer's, which is never written.
    pub write: bool,
}

/// How a CREATE treats an existing name (RFC 1813 §3.3.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Create {
    /// Create or truncate per the attributes.
    Unchecked(SetAttr),
    /// Fail with `Exist` if the name exists.
    Guarded(SetAttr),
    /// Create once per verifier: a retransmission with the same verifier
    /// succeeds, a different verifier gets `Exist`.
    Exclusive([u8; 8]),
}

/// A new entry other than a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NewEntry<'a> {
    Dir,
    /// A symbolic link to the target given.
    Symlink(&'a [u8]),
    /// A FIFO, socket or device file, with its device numbers; devices only
    /// where the host allows.
    Node(FileKind, (u32, u32)),
}

/// What [`Filesystem::allocate`] does to a range of a file (fallocate(2)'s
/// modes a door passes on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocate {
    /// Reserves the range's blocks, growing the file to cover it (mode 0).
    Extend,
    /// Reserves the range's blocks, size unchanged (`FALLOC_FL_KEEP_SIZE`).
    KeepSize,
    /// Frees the range's blocks, which then read as zeros, size unchanged
    /// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`).
    PunchHole,
}

/// How durable a WRITE must be before it is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stability {
    Unstable,
    DataSync,
    FileSync,
}

/// One directory entry; `cookie` resumes the listing after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub fileid: FileId,
    pub name: Name,
    pub cookie: u64,
    /// Present when asked for (READDIRPLUS), unless the entry vanished.
    pub attr: Option<Attr>,
}

/// An entry's name in a listing: held inline up to 32 bytes, as most are,
/// so that a page of thousands makes no allocation per entry.
pub type Name = smallvec::SmallVec<[u8; 32]>;

/// Part of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirPage {
    /// The directory's attributes as it was listed: a door checks a
    /// handle's generation against them instead of reading them again.
    pub dir: Attr,
    pub entries: Vec<DirEntry>,
    /// No entries follow the last one.
    pub eof: bool,
}

impl DirPage {
    /// The page after `cookie` of a listing of `dir` (with attributes
    /// `dir_attr`): `.` (cookie 1) and `..` (2) first, then `named`, the
    /// entries with cookies past `cookie` in cookie order (all above 2); at
    /// most `max`, without attributes.
    pub fn after<'a>(
        dir: FileId,
        dir_attr: Attr,
        parent: FileId,
        cookie: u64,
        max: usize,
        named: impl Iterator<Item = (FileId, &'a [u8], u64)>,
    ) -> DirPage {
        let dots = [(dir, &b"."[..], 1), (parent, &b".."[..], 2)];
        // Sized once: entries are large (attributes inline), and a page of
        // thousands grown by doubling would be copied over and over.
        let mut entries = Vec::with_capacity(max.min(2 + named.size_hint().0));
        let mut rest = dots
            .into_iter()
            .filter(|d| d.2 > cookie)
            .chain(named)
            .peekable();
        entries.extend(
            rest.by_ref()
                .take(max)
                .map(|(fileid, name, cookie)| DirEntry {
                    fileid,
                    name: Name::from_slice(name),
                    cookie,
                    attr: None,
                }),
        );
        DirPage {
            dir: dir_attr,
            entries,
            eof: rest.peek().is_none(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStat {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub avail_bytes: u64,
    pub total_files: u64,
    pub free_files: u64,
    pub avail_files: u64,
}

/// Attributes a listing "at hand" ([`Hints::lists_at_hand`]) may still
/// read from the host: a few directories or hard-linked files, whose inodes
/// are in memory after a listing, at about a microsecond each.
pub const READS_AT_HAND: usize = 64;

/// A tree of files addressed by stable ids. Every method checks that `caller`
/// may do what it asks. Names are single path components: no `/`, no NUL, not
/// `.` or `..` (except where `lookup` allows them), at most [`crate::NAME_MAX`] bytes.
pub trait Filesystem: Send + Sync {
    fn root(&self) -> FileId;

    /// What a door may ask to decide where a call runs; a filesystem that
    /// says nothing gets [`NoHints`]' answers.
    fn hints(&self) -> &dyn Hints {
        &NoHints
    }

    /// The host files behind this filesystem's files, for a door that
    /// sends, passes through or keeps them; `None` where files are not
    /// host files, and then every read and write goes through this trait.
    fn host_files(&self) -> Option<&dyn HostFiles> {
        None
    }

    /// Attributes of a file, or `Stale` if it no longer exists.
    fn getattr(&self, id: FileId) -> Result<Attr>;

    /// Whether `id` still names the file whose generation was `generation`.
    fn check_generation(&self, id: FileId, generation: u64) -> Result<Attr> {
        let attr = self.getattr(id)?;
        if attr.generation != generation {
            return Err(crate::Error::Stale);
        }
        Ok(attr)
    }

    /// [`Filesystem::check_generation`] for a caller that needs no
    /// attributes (a change reads its own, under its lock): a filesystem
    /// that knows the answer without asking the host gives it at once.
    fn still_names(&self, id: FileId, generation: u64) -> Result<()> {
        self.check_generation(id, generation).map(drop)
    }

    /// Sets attributes; with `guard`, only if the file's ctime still equals it.
    fn setattr(
        &self,
        caller: &Caller,
        id: FileId,
        set: &SetAttr,
        guard: Option<Timestamp>,
    ) -> Result<Change>;

    /// The entry `name` of directory `dir`; `.` and `..` are allowed (`..` of
    /// the root is the root).
    fn lookup(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Attr> {
        self.lookup_in(caller, dir, name)
            .and_then(|(found, _)| found)
    }

    /// [`Filesystem::lookup`], with the attributes `dir` had when it was
    /// searched, whether or not the name was found there: a door checks a
    /// handle's generation against them and answers a missing name with
    /// them, instead of reading them once more. The outer error is the
    /// directory's (not one, not searchable, gone).
    fn lookup_in(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<(Result<Attr>, Attr)>;

    fn readlink(&self, caller: &Caller, id: FileId) -> Result<Vec<u8>>;

    /// Appends up to `count` bytes read at `offset` to `dst` (so a reply
    /// buffer receives them without another copy); returns whether the end of
    /// the file was reached, and the file's attributes.
    fn read(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        count: usize,
        dst: &mut Vec<u8>,
    ) -> Result<(bool, Attr)>;

    /// Writes all of `data` at `offset`; returns how durable it already is.
    fn write(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        data: &[u8],
        stable: Stability,
    ) -> Result<(Change, Stability)>;

    /// Does `how` to `len` bytes at `offset` of regular file `id`, as
    /// fallocate(2) does; for a door whose clients can ask (FUSE; NFSv3 has
    /// no such call). `NotSupp` where the filesystem cannot.
    fn allocate(&self, id: FileId, offset: u64, len: u64, how: Allocate) -> Result<Change> {
        let _ = (id, offset, len, how);
        Err(Error::NotSupp)
    }

    /// Makes everything written to `id` durable.
    fn commit(&self, id: FileId) -> Result<Change>;

    fn create(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        how: Create,
    ) -> Result<(Attr, Change)>;

    /// Makes a directory, symlink or special file `name` in `dir`.
    fn make(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        what: NewEntry<'_>,
        set: &SetAttr,
    ) -> Result<(Attr, Change)>;

    fn mkdir(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        set: &SetAttr,
    ) -> Result<(Attr, Change)> {
        self.make(caller, dir, name, NewEntry::Dir, set)
    }

    fn symlink(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        target: &[u8],
        set: &SetAttr,
    ) -> Result<(Attr, Change)> {
        self.make(caller, dir, name, NewEntry::Symlink(target), set)
    }

    fn mknod(
        &self,
        caller: &Caller,
        dir: FileId,
        name: &[u8],
        kind: FileKind,
        rdev: (u32, u32),
        set: &SetAttr,
    ) -> Result<(Attr, Change)> {
        self.make(caller, dir, name, NewEntry::Node(kind, rdev), set)
    }

    fn remove(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Change>;

    fn rmdir(&self, caller: &Caller, dir: FileId, name: &[u8]) -> Result<Change>;

    /// Returns the changes to the source and the target directory.
    fn rename(
        &self,
        caller: &Caller,
        from: FileId,
        from_name: &[u8],
        to: FileId,
        to_name: &[u8],
    ) -> Result<(Change, Change)>;

    /// Links file `id` as `name` in `dir`; returns the file's attributes.
    fn link(&self, caller: &Caller, id: FileId, dir: FileId, name: &[u8])
        -> Result<(Attr, Change)>;

    /// Entries after `cookie` (0: from the start), at most `max`, with their
    /// attributes if `with_attrs`. Includes `.` and `..`. Cookies are stable:
    /// resuming from one neither repeats nor skips entries, whatever was
    /// added or removed since.
    fn readdir(
        &self,
        caller: &Caller,
        dir: FileId,
        cookie: u64,
        max: usize,
        with_attrs: bool,
    ) -> Result<DirPage>;

    fn fsstat(&self, id: FileId) -> Result<FsStat>;

    /// The value of `id`'s extended attribute `name`. Attributes reach
    /// users through the FUSE door (NFSv3 has none); the kernel has checked
    /// the caller's right to the name's namespace. A filesystem without
    /// them answers `NotSupp`.
    fn getxattr(&self, id: FileId, name: &[u8]) -> Result<Vec<u8>> {
        let _ = (id, name);
        Err(Error::NotSupp)
    }

    /// The names of `id`'s extended attributes, each followed by a NUL.
    fn listxattr(&self, id: FileId) -> Result<Vec<u8>> {
        let _ = id;
        Err(Error::NotSupp)
    }

    /// Sets `id`'s extended attribute `name` (as setxattr(2), `flags`
    /// XATTR_CREATE or XATTR_REPLACE).
    fn setxattr(&self, id: FileId, name: &[u8], value: &[u8], flags: XattrFlags) -> Result<()> {
        let _ = (id, name, value, flags);
        Err(Error::NotSupp)
    }

    fn removexattr(&self, id: FileId, name: &[u8]) -> Result<()> {
        let _ = (id, name);
        Err(Error::NotSupp)
    }
}

/// How a [`Filesystem::setxattr`] treats an existing or missing name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrFlags {
    /// Create or replace.
    #[default]
    Either,
    /// Fail with `Exist` if the name exists (XATTR_CREATE).
    Create,
    /// Fail with `NoData` if it does not (XATTR_REPLACE).
    Replace,
}

/// Scheduling hints: answered from what is already known, without a host
/// call. The defaults are what a filesystem that knows nothing more says.
pub trait Hints {
    /// Whether a call on `id` is answered without searching the tree for it
    /// (the id is known, or known to be gone). An id handed out before a
    /// restart may need a walk of the whole tree: a door runs such calls
    /// where they hold up nothing else.
    fn knows(&self, id: FileId) -> bool {
        let _ = id;
        true
    }

    /// Whether a change to `id` (with `entry`, to that entry of directory
    /// `id`, as a RENAME makes) may first copy data elsewhere (a layered
    /// filesystem's copy-up of a lower file), taking time that grows with
    /// the file's size: a door then runs the change where it holds up
    /// nothing else. Answered from what is already known, without a host
    /// call; `true` when unsure.
    fn may_copy_up(&self, id: FileId, entry: Option<&[u8]>) -> bool {
        let _ = (id, entry);
        false
    }

    /// Whether a listing of directory `dir` (with its entries' attributes
    /// if `with_attrs`) is answered from what is kept, reading at most
    /// [`READS_AT_HAND`] entries' attributes from the host: a door may then
    /// run it where it holds up other calls, as it does a CREATE. Answered
    /// from what is known, without a host call; `false` when unsure.
    fn lists_at_hand(&self, dir: FileId, with_attrs: bool) -> bool {
        let _ = (dir, with_attrs);
        false
    }
}

/// The hints of a filesystem that gives none.
pub struct NoHints;

impl Hints for NoHints {}

/// Host descriptors behind a filesystem's files.
pub trait HostFiles {
    /// Where the bytes a READ of `count` at `offset` would return live on the
    /// host: an open file, the range to send from it, whether that reaches the
    /// end of the file, and the file's attributes. A server sends such bytes
    /// from the page cache without copying them. `None` where the data is not
    /// one range of one host file; callers then use [`Filesystem::read`].
    fn read_source(
        &self,
        caller: &Caller,
        id: FileId,
        offset: u64,
        count: usize,
    ) -> Result<Option<ReadSource>> {
        let _ = (caller, id, offset, count);
        Ok(None)
    }

    /// The host file that holds regular file `id`, for a door to read and
    /// write directly (FUSE hands it to the kernel: passthrough), once
    /// `caller` may open it for reading, or for writing with `write`. Only
    /// where every read and write through the descriptor is what this trait
    /// would do: `None` elsewhere, and then callers use [`Filesystem::read`]
    /// and [`Filesystem::write`]. The descriptor may be read-only; a door
    /// that writes reopens it for writing.
    fn host_file(&self, caller: &Caller, id: FileId, write: bool) -> Result<Option<Arc<OwnedFd>>> {
        let _ = (caller, id, write);
        Ok(None)
    }

    /// The host file that holds regular file `id` now (in a layered
    /// filesystem, after a copy-up with `write`), for a door that keeps it
    /// from a caller's open to its release: once the file's last name is
    /// removed, calls on `id` are `Stale`, and the door goes on reading,
    /// writing and syncing the file through this descriptor, as a local
    /// filesystem lets a process use a file it holds open after an unlink
    /// (FUSE has opens; NFS has none). No permission check: the door checked
    /// the open. `None` where no one host file holds the file.
    fn file_to_keep(&self, id: FileId, write: bool) -> Result<Option<KeptFile>> {
        let _ = (id, write);
        Ok(None)
    }

    /// Whether `kept`, which [`file_to_keep`](Self::file_to_keep) gave for
    /// `id`, is what [`host_file`](Self::host_file) would give for an open
    /// the door has checked itself: then the door hands the kernel the
    /// file it holds, and the host is asked nothing more. False where that
    /// is not known for sure without asking.
    fn kept_is_host_file(&self, id: FileId, kept: &KeptFile, write: bool) -> bool {
        let _ = (id, kept, write);
        false
    }

    /// From now, before a removal (or a rename over a name) takes the last
    /// name of a regular file, asks `holder` whether a door's opens hold
    /// it, and keeps what they hold where the next server of the door's
    /// session can open it again ([`kept_removed`](Self::kept_removed)):
    /// the kernel's opens outlive a door's process (a crash, an upgrade),
    /// its descriptors do not. Kept until
    /// [`forget_removed`](Self::forget_removed). A filesystem that cannot
    /// keep files ignores it.
    fn hold_removed_for(&self, holder: Arc<dyn Holder>) {
        let _ = holder;
    }

    /// The files kept for a [`Holder`], opened again.
    fn kept_removed(&self) -> Result<Vec<RemovedFile>> {
        Ok(Vec::new())
    }

    /// Lets go of the file kept for `id`, once no open holds it.
    fn forget_removed(&self, id: FileId) -> Result<()> {
        let _ = id;
        Ok(())
    }
}
