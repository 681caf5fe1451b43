//! Lazy layers: the whole tree of a layer at once, its files' data later,
//! piece by piece, each piece checked against its digest before a byte of
//! it is written.
//!
//! A lazy layer is a layer like any other under `layers/<id>/` (directories,
//! links, owners, modes, times, attributes; each regular file at its size,
//! all holes), plus its state under `lazy/<id>/`:
//! - `index.json`: each file's pieces, where its [`Source`] finds them and
//!   their digests ([`Index`]);
//! - `filled`: the number of each piece written (4 bytes, little-endian),
//!   appended only once the piece's data is durable. A kill or a crash loses
//!   at most pieces not yet noted, which are fetched again; a torn last
//!   record is ignored;
//! - `on-read`: data comes only when read: the layer is not completed in
//!   the background;
//! - `complete`: every piece is in. The index stays, so that another lazy
//!   layer takes a piece it shares (by digest) from this one's file.
//!
//! The stack asks [`before_read`] before it reads a lower file: a file still
//! waiting for data is found by its host (device, inode), and the pieces the
//! read needs are brought in first. No piece is ever served unchecked: one
//! that does not match its digest fails the read with EIO and the log names
//! the image, the layer and the piece. While no file anywhere waits, a read
//! pays one atomic load.

use std::collections::hash_map::Entry as MapEntry;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::LayerId;

/// `len` bytes at `at` in a file, which the source finds at `start..end` of
/// its blob (compressed: the fetcher decompresses), checked by `digest`
/// (`sha256:<hex>`) of the `len` bytes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Piece {
    pub at: u64,
    pub len: u64,
    pub start: u64,
    pub end: u64,
    pub digest: String,
}

/// A regular file of a lazy layer: its path in the layer and its pieces,
/// which cover it (a file with none is whole).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LazyFile {
    pub path: String,
    pub pieces: Vec<Piece>,
}

/// Where a lazy layer's data is: what a fetcher needs to reach it again,
/// after a restart too. Credentials are not here: the fetcher finds them
/// for the registry, as a pull does.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Source {
    /// The image it was pulled as (`registry/repository:tag`).
    pub reference: String,
    /// The blob's digest and size.
    pub blob: String,
    pub size: u64,
    pub media_type: String,
    /// `estargz` or `zstd:chunked`: how a piece is compressed.
    pub format: String,
    /// Its registry is reached over plain HTTP (as the pull was asked).
    #[serde(default)]
    pub insecure: bool,
    /// Any certificate is taken from its registry (as the pull was asked).
    #[serde(default)]
    pub no_tls_verify: bool,
}

/// What `lazy/<id>/index.json` holds.
#[derive(Serialize, Deserialize)]
pub struct Index {
    pub source: Source,
    pub files: Vec<LazyFile>,
}

/// Brings pieces from where a lazy layer's [`Source`] is.
pub trait Fetch: Send + Sync {
    /// The uncompressed bytes of each piece, in the order asked. They are
    /// not trusted: the layer checks each against its digest.
    fn fetch(&self, pieces: &[&Piece]) -> io::Result<Vec<Vec<u8>>>;
}

/// One entry of a lazy layer's tree, as a table of contents gives it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Relative to the layer; `..` and symlinks on the way are refused.
    pub path: PathBuf,
    pub kind: EntryKind,
    /// Permission bits, setuid, setgid and sticky included.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: Option<Timespec>,
    pub xattrs: crate::Xattrs,
}

#[derive(Clone, Debug)]
pub enum EntryKind {
    Dir,
    /// A regular file of `size` bytes whose content has SHA-256 `content`,
    /// brought in as `pieces` (which cover it) are.
    File {
        size: u64,
        content: [u8; 32],
        pieces: Vec<Piece>,
    },
    /// A regular file whose content is at hand (eStargz's table itself).
    Inline(Vec<u8>),
    Symlink(PathBuf),
    /// Another name of a file earlier in the table.
    HardLink(PathBuf),
    Fifo,
    CharDevice(u64),
    BlockDevice(u64),
}

/// The file names in `lazy/<id>/`.
pub(crate) const INDEX: &str = "index.json";
const FILLED: &str = "filled";
const COMPLETE: &str = "complete";
const ON_READ: &str = "on-read";

/// Reads of one file wait for each other; files apart do not.
const STRIPES: usize = 64;

/// A lazy layer attached to the process: its pieces, which are in, and
/// where to bring the rest from.
pub struct LazyLayer {
    id: LayerId,
    root: PathBuf,
    state: PathBuf,
    source: Source,
    files: Vec<LazyFile>,
    /// Pieces are numbered file after file: each file's first number, and
    /// one past the last.
    first: Vec<u32>,
    digests: Vec<[u8; 32]>,
    filled: Vec<AtomicBool>,
    left: AtomicUsize,
    log: Mutex<File>,
    fetch: Option<Arc<dyn Fetch>>,
    stripes: Vec<Mutex<()>>,
    /// Each waiting file's host (device, inode), by file number.
    keys: Mutex<FxHashMap<u32, HostKey>>,
    /// The layer is being removed: completion stops.
    detached: AtomicBool,
}

/// A host file's (device, inode).
type HostKey = (u64, u64);

/// A file of a lazy layer, by its number; a piece, by its number.
type InLayer = (Arc<LazyLayer>, u32);
type PieceIn = (Weak<LazyLayer>, u32);

/// Every lazy layer the process has attached.
struct Attached {
    /// Files still waiting for data, by host (device, inode).
    waiting: RwLock<FxHashMap<HostKey, InLayer>>,
    /// `waiting.len()`, read without the lock.
    count: AtomicUsize,
    /// Every piece written in any layer, by digest: where another layer
    /// can copy it from.
    pieces: RwLock<FxHashMap<[u8; 32], PieceIn>>,
    layers: Mutex<FxHashMap<LayerId, Arc<LazyLayer>>>,
}

static ATTACHED: LazyLock<Attached> = LazyLock::new(|| Attached {
    waiting: RwLock::default(),
    count: AtomicUsize::new(0),
    pieces: RwLock::default(),
    layers: Mutex::default(),
});

/// Brings in the data a read of `len` bytes at `offset` of the lower file
/// `fd` needs, if it is a lazy file still waiting: the stack calls this
/// before every read of a lower file, and before a copy-up.
pub(crate) fn before_read(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    if ATTACHED.count.load(Ordering::Acquire) == 0 || len == 0 {
        return Ok(());
    }
    let stat = rustix::fs::fstat(fd)?;
    #[allow(clippy::unnecessary_cast)] // stat's field types differ between platforms
    let key = (stat.st_dev as u64, stat.st_ino as u64);
    let found = ATTACHED.waiting.read().get(&key).cloned();
    match found {
        Some((layer, file)) => layer.fill(file, offset, len),
        None => Ok(()),
    }
}

/// The lazy layer `id`, if the process has attached it.
pub fn attached(id: &LayerId) -> Option<Arc<LazyLayer>> {
    ATTACHED.layers.lock().get(id).cloned()
}

/// Attaches the lazy layer whose tree is `root` and state `state`; `fetch`
/// brings what is missing (none: reads of missing data fail with EIO).
pub(crate) fn attach(
    id: &LayerId,
    root: &Path,
    state: &Path,
    fetch: Option<Arc<dyn Fetch>>,
) -> io::Result<Arc<LazyLayer>> {
    let mut layers = ATTACHED.layers.lock();
    if let Some(layer) = layers.get(id) {
        return Ok(layer.clone());
    }
    let index: Index = serde_json::from_slice(&std::fs::read(state.join(INDEX))?)
        .map_err(|e| io::Error::other(format!("lazy layer {id}: its index: {e}")))?;
    let mut first = Vec::with_capacity(index.files.len() + 1);
    let mut digests = Vec::new();
    for file in &index.files {
        first.push(digests.len() as u32);
        for piece in &file.pieces {
            digests.push(parse_digest(&piece.digest).ok_or_else(|| {
                io::Error::other(format!(
                    "lazy layer {id}: a piece's digest {}",
                    piece.digest
                ))
            })?);
        }
    }
    first.push(digests.len() as u32);
    let filled: Vec<AtomicBool> = digests.iter().map(|_| AtomicBool::new(false)).collect();
    let complete = state.join(COMPLETE).exists();
    let mut noted = Vec::new();
    match File::open(state.join(FILLED)) {
        Ok(mut log) => {
            log.read_to_end(&mut noted)?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    for record in noted.chunks_exact(4) {
        let n = u32::from_le_bytes(record.try_into().expect("4 bytes")) as usize;
        if let Some(piece) = filled.get(n) {
            piece.store(true, Ordering::Relaxed);
        }
    }
    if complete {
        filled.iter().for_each(|p| p.store(true, Ordering::Relaxed));
    }
    let left = filled.iter().filter(|p| !p.load(Ordering::Relaxed)).count();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state.join(FILLED))?;
    let layer = Arc::new(LazyLayer {
        id: id.clone(),
        root: root.to_path_buf(),
        state: state.to_path_buf(),
        source: index.source,
        files: index.files,
        first,
        digests,
        filled,
        left: AtomicUsize::new(left),
        log: Mutex::new(log),
        fetch,
        stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        keys: Mutex::default(),
        detached: AtomicBool::new(false),
    });
    {
        let mut shared = ATTACHED.pieces.write();
        for (n, digest) in layer.digests.iter().enumerate() {
            if layer.filled[n].load(Ordering::Relaxed) {
                shared
                    .entry(*digest)
                    .or_insert((Arc::downgrade(&layer), n as u32));
            }
        }
    }
    let root_fd = open_dir(&layer.root)?;
    let mut waiting = ATTACHED.waiting.write();
    let mut keys = layer.keys.lock();
    for (file, lazy) in layer.files.iter().enumerate() {
        if layer.file_is_whole(file as u32) {
            continue;
        }
        let fd = open_in(&root_fd, &lazy.path, OFlags::RDONLY)?;
        let stat = rustix::fs::fstat(&fd)?;
        #[allow(clippy::unnecessary_cast)]
        let key = (stat.st_dev as u64, stat.st_ino as u64);
        waiting.insert(key, (layer.clone(), file as u32));
        keys.insert(file as u32, key);
    }
    ATTACHED.count.store(waiting.len(), Ordering::Release);
    drop(keys);
    drop(waiting);
    layers.insert(id.clone(), layer.clone());
    Ok(layer)
}

/// Forgets lazy layer `id` (it is being removed).
pub(crate) fn detach(id: &LayerId) {
    let Some(layer) = ATTACHED.layers.lock().remove(id) else {
        return;
    };
    layer.detached.store(true, Ordering::Release);
    let mut waiting = ATTACHED.waiting.write();
    for key in layer.keys.lock().drain().map(|(_, key)| key) {
        waiting.remove(&key);
    }
    ATTACHED.count.store(waiting.len(), Ordering::Release);
    ATTACHED.pieces.write().retain(|_, (owner, _)| {
        owner.strong_count() > 0 && !Weak::ptr_eq(owner, &Arc::downgrade(&layer))
    });
}

impl LazyLayer {
    pub fn id(&self) -> &LayerId {
        &self.id
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Whether the layer has been removed from the store.
    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }

    /// Whether its data is to come only when read (no completion).
    pub fn on_read(&self) -> bool {
        self.state.join(ON_READ).exists()
    }

    /// Keeps its data coming only when read, or lets it be completed.
    pub fn set_on_read(&self, on_read: bool) -> io::Result<()> {
        let marker = self.state.join(ON_READ);
        match on_read {
            true => File::create(marker).map(drop),
            false => match std::fs::remove_file(marker) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        }
    }

    /// Whether every piece is in.
    pub fn is_complete(&self) -> bool {
        self.left.load(Ordering::Acquire) == 0
    }

    /// Bytes of file data in, and in all.
    pub fn bytes(&self) -> (u64, u64) {
        let mut local = 0;
        let mut all = 0;
        for (n, piece) in self.pieces().enumerate() {
            all += piece.len;
            if self.filled[n].load(Ordering::Relaxed) {
                local += piece.len;
            }
        }
        (local, all)
    }

    /// Every piece, in number order.
    fn pieces(&self) -> impl Iterator<Item = &Piece> {
        self.files.iter().flat_map(|f| f.pieces.iter())
    }

    fn piece(&self, n: u32) -> (u32, &Piece) {
        let file = self.first.partition_point(|&first| first <= n) - 1;
        let piece = &self.files[file].pieces[(n - self.first[file]) as usize];
        (file as u32, piece)
    }

    fn file_is_whole(&self, file: u32) -> bool {
        let (from, to) = (self.first[file as usize], self.first[file as usize + 1]);
        (from..to).all(|n| self.filled[n as usize].load(Ordering::Acquire))
    }

    /// Brings in the pieces of `file` that `len` bytes at `offset` need.
    fn fill(&self, file: u32, offset: u64, len: u64) -> io::Result<()> {
        let end = offset.saturating_add(len);
        let wanted = || -> Vec<u32> {
            let (from, to) = (self.first[file as usize], self.first[file as usize + 1]);
            (from..to)
                .filter(|&n| {
                    let piece = self.piece(n).1;
                    piece.at < end
                        && piece.at + piece.len > offset
                        && !self.filled[n as usize].load(Ordering::Acquire)
                })
                .collect()
        };
        if wanted().is_empty() {
            return Ok(());
        }
        let _one_at_a_time = self.stripes[file as usize % STRIPES].lock();
        self.bring(&wanted())
    }

    /// Brings in every piece still missing, a batch of about `batch` bytes
    /// of the blob at a time, in the blob's order (an eStargz blob puts the
    /// files to prefetch first), until done or `stop` is set. Returns
    /// whether the layer is complete.
    pub fn complete(&self, batch: u64, stop: &AtomicBool) -> io::Result<bool> {
        let mut missing: Vec<u32> = (0..self.filled.len() as u32)
            .filter(|&n| !self.filled[n as usize].load(Ordering::Acquire))
            .collect();
        missing.sort_by_key(|&n| self.piece(n).1.start);
        let mut at = 0;
        while at < missing.len() {
            if stop.load(Ordering::Relaxed) || self.detached.load(Ordering::Acquire) {
                return Ok(false);
            }
            let first = self.piece(missing[at]).1.start;
            let mut to = at + 1;
            while to < missing.len() && self.piece(missing[to]).1.end - first <= batch {
                to += 1;
            }
            self.bring(&missing[at..to])?;
            at = to;
        }
        Ok(self.is_complete())
    }

    /// Brings in pieces `numbers`: each from a layer that has it already,
    /// else from the source; checks each; writes it; notes it.
    fn bring(&self, numbers: &[u32]) -> io::Result<()> {
        let numbers: Vec<u32> = numbers
            .iter()
            .copied()
            .filter(|&n| !self.filled[n as usize].load(Ordering::Acquire))
            .collect();
        let mut data: Vec<Option<Vec<u8>>> = numbers.iter().map(|&n| self.shared(n)).collect();
        let to_fetch: Vec<usize> = (0..numbers.len()).filter(|&i| data[i].is_none()).collect();
        if !to_fetch.is_empty() {
            let fetch = self.fetch.as_ref().ok_or_else(|| {
                io::Error::other(format!(
                    "lazy layer {}: no way to reach {} to fetch its data",
                    self.id, self.source.reference
                ))
            })?;
            let asked: Vec<&Piece> = to_fetch.iter().map(|&i| self.piece(numbers[i]).1).collect();
            let got = fetch.fetch(&asked).map_err(|e| {
                tracing::error!(image = %self.source.reference, layer = %self.id, error = %e,
                    "cannot fetch a lazy layer's data");
                io::Error::new(e.kind(), format!("{}: {e}", self.source.reference))
            })?;
            if got.len() != asked.len() {
                return Err(io::Error::other(
                    "the fetcher answered a different number of pieces",
                ));
            }
            for (&i, bytes) in to_fetch.iter().zip(got) {
                self.check(numbers[i], &bytes)?;
                data[i] = Some(bytes);
            }
        }
        // Written file by file: each file synced once, then its pieces noted.
        let mut at = 0;
        while at < numbers.len() {
            let file = self.piece(numbers[at]).0;
            let mut to = at + 1;
            while to < numbers.len() && self.piece(numbers[to]).0 == file {
                to += 1;
            }
            let pieces: Vec<(&Piece, &[u8])> = (at..to)
                .map(|i| {
                    (
                        self.piece(numbers[i]).1,
                        data[i].as_deref().expect("every piece in hand"),
                    )
                })
                .collect();
            self.write(file, &pieces)?;
            self.note(&numbers[at..to])?;
            at = to;
        }
        Ok(())
    }

    /// Piece `n` as another attached layer holds it, checked.
    fn shared(&self, n: u32) -> Option<Vec<u8>> {
        let digest = self.digests[n as usize];
        let (owner, m) = ATTACHED.pieces.read().get(&digest).cloned()?;
        let owner = owner.upgrade()?;
        let (file, piece) = owner.piece(m);
        let fd = open_in(
            &open_dir(&owner.root).ok()?,
            &owner.files[file as usize].path,
            OFlags::RDONLY,
        )
        .ok()?;
        let mut bytes = vec![0; piece.len as usize];
        File::from(fd).read_exact_at(&mut bytes, piece.at).ok()?;
        (self.check(n, &bytes).is_ok()).then_some(bytes)
    }

    /// Piece `n`'s bytes are what its digest says, or the read fails.
    fn check(&self, n: u32, bytes: &[u8]) -> io::Result<()> {
        let (file, piece) = self.piece(n);
        let digest: [u8; 32] = Sha256::digest(bytes).into();
        if bytes.len() as u64 == piece.len && digest == self.digests[n as usize] {
            return Ok(());
        }
        let path = &self.files[file as usize].path;
        tracing::error!(
            image = %self.source.reference, layer = %self.id, file = %path,
            at = piece.at, len = piece.len, blob_range = ?(piece.start..piece.end),
            "a lazy layer's piece does not match its digest: not used"
        );
        Err(io::Error::other(format!(
            "{}: the piece of {path} at {} does not match its digest",
            self.source.reference, piece.at
        )))
    }

    /// Writes `pieces` into `file` and makes them durable, its times kept
    /// (the layer's file is read-only to everyone else).
    fn write(&self, file: u32, pieces: &[(&Piece, &[u8])]) -> io::Result<()> {
        let path = &self.files[file as usize].path;
        let root = open_dir(&self.root)?;
        let (parent, name) = parent_of(&root, path)?;
        let stat = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(io::Error::other(format!(
                "lazy layer {}: {path} is not a file",
                self.id
            )));
        }
        let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let (fd, mode_back) = match rustix::fs::openat(&parent, name, flags, Mode::empty()) {
            Ok(fd) => (fd, None),
            // A daemon run as a user owns the file, whose mode may not let
            // even its owner write: write is allowed for the moment.
            Err(Errno::ACCESS) => {
                let mode = Mode::from_raw_mode(stat.st_mode as _) & Mode::from_raw_mode(0o7777);
                rustix::fs::chmodat(&parent, name, mode | Mode::WUSR, AtFlags::empty())?;
                (
                    rustix::fs::openat(&parent, name, flags, Mode::empty())?,
                    Some(mode),
                )
            }
            Err(e) => return Err(e.into()),
        };
        let out = File::from(fd);
        let written = pieces
            .iter()
            .try_for_each(|(piece, bytes)| out.write_all_at(bytes, piece.at))
            .and_then(|()| out.sync_data());
        let times = Timestamps {
            last_access: Timespec {
                tv_sec: stat.st_atime as _,
                tv_nsec: stat.st_atime_nsec as _,
            },
            last_modification: Timespec {
                tv_sec: stat.st_mtime as _,
                tv_nsec: stat.st_mtime_nsec as _,
            },
        };
        let kept = rustix::fs::futimens(&out, &times);
        if let Some(mode) = mode_back {
            rustix::fs::fchmod(&out, mode)?;
        }
        written?;
        Ok(kept?)
    }

    /// Notes pieces `numbers` as in (their data durable already).
    fn note(&self, numbers: &[u32]) -> io::Result<()> {
        let mut record = Vec::with_capacity(numbers.len() * 4);
        let mut newly = Vec::new();
        for &n in numbers {
            if !self.filled[n as usize].load(Ordering::Acquire) {
                record.extend_from_slice(&n.to_le_bytes());
                newly.push(n);
            }
        }
        self.log.lock().write_all(&record)?;
        let Some(me) = ATTACHED.layers.lock().get(&self.id).map(Arc::downgrade) else {
            return Ok(());
        };
        for &n in &newly {
            if !self.filled[n as usize].swap(true, Ordering::AcqRel) {
                self.left.fetch_sub(1, Ordering::AcqRel);
                ATTACHED
                    .pieces
                    .write()
                    .entry(self.digests[n as usize])
                    .or_insert((me.clone(), n));
            }
        }
        let file = self.piece(numbers[0]).0;
        if self.file_is_whole(file) {
            let key = self.keys.lock().remove(&file);
            if let Some(key) = key {
                let mut waiting = ATTACHED.waiting.write();
                waiting.remove(&key);
                ATTACHED.count.store(waiting.len(), Ordering::Release);
            }
        }
        if self.is_complete() {
            self.log.lock().sync_all()?;
            let marker = File::create(self.state.join(COMPLETE))?;
            marker.sync_all()?;
            File::open(&self.state)?.sync_all()?;
            tracing::info!(layer = %self.id, image = %self.source.reference, "lazy layer complete");
        }
        Ok(())
    }
}

/// `sha256:<hex>` as bytes.
pub fn parse_digest(digest: &str) -> Option<[u8; 32]> {
    let hex = digest.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The directory holding `path` (relative to `root`) and its last name,
/// walked without following a symlink.
fn parent_of<'p>(root: &OwnedFd, path: &'p str) -> io::Result<(OwnedFd, &'p OsStr)> {
    let mut names = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(name) => names.push(name),
            Component::CurDir | Component::RootDir => {}
            _ => return Err(io::Error::other(format!("{path}: leads out of the layer"))),
        }
    }
    let Some((name, dirs)) = names.split_last() else {
        return Err(io::Error::other("the layer's root is not a file"));
    };
    let mut dir = root.try_clone()?;
    for d in dirs {
        dir = rustix::fs::openat(
            &dir,
            *d,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
    }
    Ok((dir, name))
}

/// Opens the file at `path` in `root`, no symlink followed on the way.
pub(crate) fn open_in(root: &OwnedFd, path: &str, flags: OFlags) -> io::Result<OwnedFd> {
    let (dir, name) = parent_of(root, path)?;
    Ok(rustix::fs::openat(
        &dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The lazy files of a tree just written: each regular file once (the last
/// entry of a path wins, as it did in the tree; a second name of a file is
/// not a second file), dropping those no longer there.
pub(crate) fn files_in(root: &Path, entries: &[Entry]) -> io::Result<Vec<LazyFile>> {
    let root = open_dir(root)?;
    let mut seen = FxHashMap::default();
    let mut files = Vec::new();
    for entry in entries.iter().rev() {
        let EntryKind::File { pieces, size, .. } = &entry.kind else {
            continue;
        };
        let path = entry.path.as_os_str().as_bytes();
        let path = std::str::from_utf8(path).map_err(|_| {
            io::Error::other(format!(
                "{}: a name that is not UTF-8",
                entry.path.display()
            ))
        })?;
        let Ok(fd) = open_in(&root, path, OFlags::RDONLY) else {
            continue;
        };
        let stat = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
            || stat.st_size as u64 != *size
        {
            continue;
        }
        if let MapEntry::Vacant(v) = seen.entry(stat.st_ino) {
            v.insert(());
            if !pieces.is_empty() {
                files.push(LazyFile {
                    path: path.to_string(),
                    pieces: pieces.clone(),
                });
            }
        }
    }
    files.reverse();
    Ok(files)
}

/// Checks that `pieces` cover a file of `size` bytes exactly, in order, and
/// lie inside a blob of `blob` bytes.
pub fn check_pieces(pieces: &[Piece], size: u64, blob: u64) -> Result<(), String> {
    let mut at = 0;
    for piece in pieces {
        if piece.at != at || piece.len == 0 {
            return Err(format!(
                "its pieces do not cover it in order (one at {})",
                piece.at
            ));
        }
        if piece.start >= piece.end || piece.end > blob {
            return Err(format!(
                "a piece at {}..{} is outside the blob of {blob} bytes",
                piece.start, piece.end
            ));
        }
        if parse_digest(&piece.digest).is_none() {
            return Err(format!("a piece's digest {:?} is not sha256", piece.digest));
        }
        at += piece.len;
    }
    if at != size && !(pieces.is_empty() && size == 0) {
        return Err(format!("its pieces hold {at} of its {size} bytes"));
    }
    Ok(())
}
