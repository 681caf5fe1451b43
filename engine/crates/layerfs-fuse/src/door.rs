//! FUSE requests answered by a [`Filesystem`].
//!
//! The kernel checks permission first (the mount has `default_permissions`);
//! the door checks again where the kernel asks (lookup, open, every change)
//! with the caller's identity. A READ or WRITE on a file the kernel already
//! opened is not checked again, as on a local filesystem, so a file opened
//! for writing stays writable after a chmod, and the kernel's own writeback
//! (sent without a caller) goes through.

use std::cell::RefCell;
use std::os::fd::AsFd;
use std::sync::Arc;

use crate::types::{
    AccessFlags, Errno, FileHandle, FopenFlags, Generation, INodeNo, OpenAccMode, OpenFlags,
    RenameFlags, TimeOrNow, WriteFlags,
};
use layerfs_vfs::access::{permits, Perm};
use layerfs_vfs::bounded::BoundedMap;
use layerfs_vfs::hostdir;
use layerfs_vfs::{
    Allocate, Attr, Caller, Create, Error, FileId, FileKind, Filesystem, KeptFile, NewEntry,
    SetAttr, SetTime, Stability, XattrFlags,
};
use rustix::fs::{Gid, Uid};

use crate::answer::{
    Answer, AttrAnswer, CreateAnswer, DataAnswer, EmptyAnswer, EntryAnswer, ListingAnswer,
    ListingPlusAnswer, OpenAnswer, Statfs, StatfsAnswer, WriteAnswer, XattrAnswer,
};
use crate::attrs::{kind, kind_of_mode, timestamp, Caching, Inos};
use crate::backing::Backing;
use crate::callers::Callers;
use crate::connection::Connection;
use crate::forgets::Forgets;
use crate::opens::{Held, OpenFiles, Way, CACHED, PASSTHROUGH};
use crate::privilege;
use crate::routes::Routes;

mod dirs;
mod entries;
mod files;
pub(crate) use files::read_from;
mod passthrough;
mod removed;
#[cfg(test)]
mod testing;
mod xattrs;

pub struct Door {
    fs: Arc<dyn Filesystem>,
    inos: Inos,
    caching: Caching,
    callers: Callers,
    /// Whether the kernel agreed to passthrough (see [`crate::opens`]).
    passthrough: bool,
    opens: Arc<OpenFiles<Backing>>,
    /// Whether the filesystem keeps extended attributes: asked once, as
    /// a filesystem without them is answered ENOSYS, which the kernel
    /// remembers for the mount (no request per write for the
    /// security.capability it looks for).
    xattrs: bool,
    no_caps: Arc<NoCaps>,
    /// The connection the door answers, where backing files are registered
    /// and the kernel is told to forget what it cached; none for a door
    /// that is asked directly (the tests').
    connection: Option<Arc<Connection>>,
    /// Whether the rings serve, which lets FORGETs wait.
    forgets: Arc<Forgets>,
    /// Requests answered through each route.
    routes: Arc<Routes>,
}

/// The inodes known to have no `security.capability`. The kernel looks for
/// one before the first write to each inode (before every write to a file
/// with setuid or setgid); an inode here is answered at once. Only an
/// answer that none exists is kept, and any change of an attribute, or a
/// reset of the workspace, forgets them all: a wrong "none" would let a
/// write keep a binary's capabilities.
pub struct NoCaps(parking_lot::Mutex<BoundedMap<u64, ()>>);

impl Default for NoCaps {
    fn default() -> Self {
        NoCaps(parking_lot::Mutex::new(BoundedMap::new(Self::MAX)))
    }
}

impl NoCaps {
    /// Inodes kept at most; past it, the set starts over.
    const MAX: usize = 1 << 16;

    fn has_none(&self, ino: INodeNo) -> bool {
        self.0.lock().contains_key(&ino.0)
    }

    fn found_none(&self, ino: INodeNo) {
        self.0.lock().insert(ino.0, ());
    }

    /// Forgets every inode.
    pub fn forget(&self) {
        self.0.lock().clear();
    }
}

const CAPABILITY: &[u8] = b"security.capability";

thread_local! {
    /// Each FUSE thread reads into one buffer for its life.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The errno a request is answered with. EIO is a failure of the door or
/// of the host, never an answer about the file: each is logged (the first
/// ten, then every thousandth), so that a program's EIO can be traced.
fn errno(e: Error) -> Errno {
    if e == Error::Io {
        static ANSWERED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = ANSWERED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n <= 10 || n.is_multiple_of(1000) {
            tracing::warn!(
                times = n,
                "a FUSE request was answered EIO (a failure of the door or of the host)"
            );
        }
    }
    Errno::from_i32(e.errno())
}

/// Answers a request that returns nothing but success or an error.
fn done<T>(reply: impl EmptyAnswer, result: layerfs_vfs::Result<T>) {
    match result {
        Ok(_) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// An attribute's value or name list: its size when asked (`size` 0), else
/// the bytes if they fit.
fn xattr_reply(reply: impl XattrAnswer, bytes: &[u8], size: u32) {
    match size {
        0 => reply.size(bytes.len() as u32),
        n if bytes.len() <= n as usize => reply.data(bytes),
        _ => reply.error(Errno::ERANGE),
    }
}

/// Open files recorded where a server taking the session over finds them;
/// without a table where none can be made (the session then cannot be
/// taken over with files open through passthrough).
fn new_open_files() -> OpenFiles<Backing> {
    match crate::open_table::OpenTable::new() {
        Ok(table) => OpenFiles::default().with_table(table),
        Err(e) => {
            tracing::warn!("no open-file table for the next server of this session: {e}");
            OpenFiles::default()
        }
    }
}

impl Door {
    /// A door for `fs` that is asked directly, with no connection: it
    /// passes nothing through and notifies nothing.
    pub fn new(fs: Arc<dyn Filesystem>, caching: Caching) -> Door {
        let inos = Inos::new(fs.root());
        let xattrs = !matches!(fs.listxattr(fs.root()), Err(Error::NotSupp));
        Door {
            xattrs,
            no_caps: Arc::default(),
            fs,
            inos,
            caching,
            callers: Callers::default(),
            passthrough: false,
            opens: Arc::new(new_open_files()),
            connection: None,
            forgets: Arc::default(),
            routes: Arc::default(),
        }
    }

    /// A door for `fs` answering `connection`: it passes files through
    /// where the connection agreed to it.
    pub fn answering(
        fs: Arc<dyn Filesystem>,
        caching: Caching,
        connection: Arc<Connection>,
    ) -> Door {
        Door {
            passthrough: connection.agreed().passthrough(),
            connection: Some(connection),
            ..Door::new(fs, caching)
        }
    }

    /// A door sharing this one's state, to serve a CPU's ring or a thread
    /// of `/dev/fuse`.
    pub fn sibling(&self) -> Door {
        Door {
            fs: self.fs.clone(),
            inos: self.inos,
            caching: self.caching,
            callers: Callers::default(),
            passthrough: self.passthrough,
            opens: self.opens.clone(),
            xattrs: self.xattrs,
            no_caps: self.no_caps.clone(),
            connection: self.connection.clone(),
            forgets: self.forgets.clone(),
            routes: self.routes.clone(),
        }
    }

    /// Said by a ring at its first request (see [`crate::forgets`]).
    pub(crate) fn rings_serve(&self) {
        self.forgets.rings_serve();
    }

    /// A FORGET or BATCH_FORGET came: the door keeps no lookup counts,
    /// but the read of the next request may wait ([`crate::forgets`]).
    pub(crate) fn forgotten(&self) {
        self.forgets.handled();
    }

    pub(crate) fn answered_through_device(&self) {
        self.routes.through_device();
    }

    pub(crate) fn answered_on_ring(&self) {
        self.routes.through_rings();
    }

    /// Requests answered through each route, shared by this door's siblings.
    pub(crate) fn routes(&self) -> Arc<Routes> {
        self.routes.clone()
    }

    /// The inodes known to have no file capabilities, for the mount's owner
    /// to forget when it changes files behind the door (a reset).
    pub fn no_caps(&self) -> Arc<NoCaps> {
        self.no_caps.clone()
    }

    /// Between the filesystem's ids and the kernel's inode numbers.
    pub fn inos(&self) -> Inos {
        self.inos
    }

    /// The door's open files, for the mount's owner to ask about.
    pub fn open_files(&self) -> Arc<OpenFiles<Backing>> {
        self.opens.clone()
    }

    /// Goes on from the opens another server of the session recorded.
    pub fn with_open_files(mut self, opens: OpenFiles<Backing>) -> Door {
        self.opens = Arc::new(opens);
        self
    }

    fn caller_of(&self, who: Who) -> Caller {
        self.callers.caller(who.uid, who.gid, who.pid)
    }

    fn id(&self, ino: INodeNo) -> FileId {
        self.inos.id(ino)
    }

    fn entry(&self, reply: impl EntryAnswer, result: layerfs_vfs::Result<Attr>) {
        match result {
            Ok(attr) => reply.entry(
                &self.caching.ttl(),
                &self.inos.attr(&attr),
                Generation(attr.generation),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// The attributes after a change, or the file's own if the change did
    /// not report them.
    fn after(&self, id: FileId, after: Option<Attr>) -> layerfs_vfs::Result<Attr> {
        match after {
            Some(a) => Ok(a),
            None => self.fs.getattr(id),
        }
    }
}

/// What a new entry is made with: the permission bits of `mode` (the
/// kernel has applied the caller's umask already).
fn with_mode(mode: u32) -> SetAttr {
    SetAttr {
        mode: Some(mode & 0o7777),
        ..SetAttr::default()
    }
}

pub(crate) fn set_time(t: Option<TimeOrNow>) -> SetTime {
    match t {
        None => SetTime::Keep,
        Some(TimeOrNow::Now) => SetTime::ServerNow,
        Some(TimeOrNow::SpecificTime(t)) => SetTime::Client(timestamp(t)),
    }
}

/// What an access(2) of `mask` asks for.
pub(crate) fn wanted(mask: AccessFlags) -> Perm {
    let mut want = Perm::empty();
    want.set(Perm::READ, mask.contains(AccessFlags::R_OK));
    want.set(Perm::WRITE, mask.contains(AccessFlags::W_OK));
    want.set(Perm::EXEC, mask.contains(AccessFlags::X_OK));
    want
}

/// What an open with `flags` asks for.
fn open_wants(flags: OpenFlags) -> Perm {
    match flags.acc_mode() {
        OpenAccMode::O_RDONLY => Perm::READ,
        OpenAccMode::O_WRONLY => Perm::WRITE,
        OpenAccMode::O_RDWR => Perm::READ | Perm::WRITE,
    }
}

/// The attributes of `id`, open as `file` with no name left.
fn held_attr(id: FileId, file: &KeptFile) -> layerfs_vfs::Result<Attr> {
    shown_held(id, file.host_attr()?)
}

/// What clients see of `id`, which has no name left, whose host file has
/// `attr`.
fn shown_held(id: FileId, mut attr: Attr) -> layerfs_vfs::Result<Attr> {
    attr.fileid = id;
    // A lower file of a stack still has its name in the layer.
    attr.nlink = 0;
    Ok(attr)
}

/// Who made a request, as the kernel's header says.
#[derive(Clone, Copy, Debug)]
pub struct Who {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}
