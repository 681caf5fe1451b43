//! One lazy layer: its pieces, which are in, and how a missing one is
//! brought in: from a layer that has it, else fetched; checked; written
//! with its file's times kept; later synced with others and noted
//! (`pieces.rs`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use super::attached::{Attached, HostKey};
use super::log::{Log, Noted};
use super::pieces::Pieces;
use super::tree::Dirs;
use super::{
    parse_digest, Fetch, Index, LazyFile, Piece, Source, COMPLETE, FILLED, INDEX, ON_READ,
    PERMISSIONS,
};
use crate::LayerId;

/// Reads of one file wait for each other; files apart do not.
const STRIPES: usize = 64;

/// How far past what a read needs a read brings in files of the same
/// directory, in bytes of the blob.
const READ_AHEAD: u64 = 256 * 1024;

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
    states: Pieces,
    log: Mutex<Log>,
    fetch: RwLock<Option<Arc<dyn Fetch>>>,
    /// The store's lazy layers, which this one lends pieces to and borrows
    /// them from, and this layer as they know it.
    store: Weak<Attached>,
    me: Weak<LazyLayer>,
    stripes: Vec<Mutex<()>>,
    /// Each waiting file's host (device, inode), by file number.
    pub(super) keys: Mutex<FxHashMap<u32, HostKey>>,
    /// The layer is being removed: completion stops.
    detached: AtomicBool,
}

impl LazyLayer {
    /// Reads lazy layer `id`'s state: its index, and which pieces are in.
    pub(super) fn load(
        id: &LayerId,
        root: &Path,
        state: &Path,
        fetch: Option<Arc<dyn Fetch>>,
        store: Weak<Attached>,
    ) -> io::Result<Arc<LazyLayer>> {
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
        let complete = state.join(COMPLETE).exists();
        let (log, noted) = Log::open(&state.join(FILLED))?;
        let mut layer = LazyLayer {
            id: id.clone(),
            root: root.to_path_buf(),
            state: state.to_path_buf(),
            source: index.source,
            files: index.files,
            first,
            states: Pieces::new(0, []),
            digests,
            log: Mutex::new(log),
            fetch: RwLock::new(fetch),
            store,
            me: Weak::new(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            keys: Mutex::default(),
            detached: AtomicBool::new(false),
        };
        let noted = match noted {
            Noted::Checked(pieces) => pieces,
            Noted::Unchecked(pieces) if complete => pieces,
            // An earlier layerfs's log may name pieces that never came:
            // only those whose data is in the file are kept.
            Noted::Unchecked(pieces) => {
                let kept = layer.in_their_files(pieces);
                *layer.log.get_mut() = Log::rewrite(&state.join(FILLED), &kept)?;
                tracing::info!(layer = %id, pieces = kept.len(),
                    "an earlier layerfs's log of pieces in: checked against the data and rewritten");
                kept
            }
        };
        let count = layer.digests.len();
        layer.states = match complete {
            true => Pieces::new(count, 0..count as u32),
            false => Pieces::new(count, noted),
        };
        Ok(Arc::new_cyclic(|me| LazyLayer {
            me: me.clone(),
            ..layer
        }))
    }

    /// Of pieces `numbers`, those whose bytes in their file match their
    /// digest (duplicates and numbers past the last piece left out).
    fn in_their_files(&self, mut numbers: Vec<u32>) -> Vec<u32> {
        numbers.sort_unstable();
        numbers.dedup();
        numbers.retain(|&n| (n as usize) < self.digests.len());
        let Ok(mut dirs) = Dirs::new(&self.root) else {
            return Vec::new();
        };
        let mut open: Option<(u32, File)> = None;
        numbers.retain(|&n| {
            let (file, piece) = self.piece(n);
            if open.as_ref().is_none_or(|(f, _)| *f != file) {
                open = dirs
                    .open(&self.files[file as usize].path, OFlags::RDONLY)
                    .ok()
                    .map(|fd| (file, File::from(fd)));
            }
            let Some((_, fd)) = &open else {
                return false;
            };
            let mut bytes = vec![0; piece.len as usize];
            fd.read_exact_at(&mut bytes, piece.at).is_ok()
                && <[u8; 32]>::from(Sha256::digest(&bytes)) == self.digests[n as usize]
        });
        numbers
    }

    /// The host (device, inode) of each file still waiting for data.
    pub(super) fn waiting_files(&self) -> io::Result<FxHashMap<u32, HostKey>> {
        let mut dirs = Dirs::new(&self.root)?;
        let mut keys = FxHashMap::default();
        for (file, lazy) in self.files.iter().enumerate() {
            if self.file_is_whole(file as u32) {
                continue;
            }
            let stat = dirs.stat(&lazy.path)?;
            // Write permission lent for a piece by a process that ended
            // before it took it back ([`LazyFile::mode`]).
            let mode =
                Mode::from_raw_mode(stat.st_mode as _) & Mode::from_raw_mode(PERMISSIONS as _);
            let owner_may_not_write = |m: u32| !Mode::from_raw_mode(m as _).contains(Mode::WUSR);
            if lazy.mode.is_some_and(owner_may_not_write) && mode.contains(Mode::WUSR) {
                let (parent, name) = dirs.parent(&lazy.path)?;
                rustix::fs::chmodat(parent, name, mode - Mode::WUSR, AtFlags::empty())?;
                tracing::info!(layer = %self.id, file = lazy.path, "write permission lent for a piece taken back");
            }
            #[allow(clippy::unnecessary_cast)] // stat's field types differ between platforms
            keys.insert(file as u32, (stat.st_dev as u64, stat.st_ino as u64));
        }
        Ok(keys)
    }

    /// The numbers of the pieces in.
    pub(super) fn filled_pieces(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.states.len() as u32).filter(|&n| !self.states.is_missing(n))
    }

    pub(super) fn digest(&self, n: u32) -> [u8; 32] {
        self.digests[n as usize]
    }

    /// Fetches from now through `fetch`.
    pub(super) fn set_fetch(&self, fetch: Arc<dyn Fetch>) {
        *self.fetch.write() = Some(fetch);
    }

    pub(super) fn detach(&self) {
        self.detached.store(true, Ordering::Release);
    }

    /// Its tree on the host.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

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

    /// Whether every piece is in, durable and noted.
    pub fn is_complete(&self) -> bool {
        self.states.all_noted()
    }

    /// Bytes of file data in, and in all.
    pub fn bytes(&self) -> (u64, u64) {
        let mut local = 0;
        let mut all = 0;
        for (n, piece) in self.all_pieces().enumerate() {
            all += piece.len;
            if !self.states.is_missing(n as u32) {
                local += piece.len;
            }
        }
        (local, all)
    }

    /// Every piece, in number order.
    fn all_pieces(&self) -> impl Iterator<Item = &Piece> {
        self.files.iter().flat_map(|f| f.pieces.iter())
    }

    pub(super) fn piece(&self, n: u32) -> (u32, &Piece) {
        let file = self.first.partition_point(|&first| first <= n) - 1;
        let piece = &self.files[file].pieces[(n - self.first[file]) as usize];
        (file as u32, piece)
    }

    /// Whether every piece of `file` is noted: it need not be waited for
    /// again, in this process or the next.
    fn file_is_whole(&self, file: u32) -> bool {
        let (from, to) = (self.first[file as usize], self.first[file as usize + 1]);
        (from..to).all(|n| self.states.is_noted(n))
    }

    /// Brings in the pieces of `file` that `len` bytes at `offset` need.
    pub(super) fn fill(&self, file: u32, offset: u64, len: u64) -> io::Result<()> {
        let end = offset.saturating_add(len);
        let wanted = || -> Vec<u32> {
            let (from, to) = (self.first[file as usize], self.first[file as usize + 1]);
            (from..to)
                .filter(|&n| {
                    let piece = self.piece(n).1;
                    piece.at < end && piece.at + piece.len > offset && self.states.is_missing(n)
                })
                .collect()
        };
        if wanted().is_empty() {
            return Ok(());
        }
        let _one_at_a_time = self.stripes[file as usize % STRIPES].lock();
        let mut wanted = wanted();
        let needed = wanted.len();
        if let Some(&last) = wanted.last() {
            wanted.extend(self.neighbours(last));
        }
        let got = self.gather(&wanted, needed)?;
        self.keep(&got)?;
        // A read waits for a sync only past the bound in bytes: noting
        // after a while is left to whoever notes now and then (the daemon,
        // each second), so a read does not stall its door for one.
        if self.states.note_due(false) {
            self.note_written()?;
        }
        Ok(())
    }

    /// Pieces missing after piece `n` in the blob, of files in the same
    /// directory, up to [`READ_AHEAD`] bytes of the blob on: files of one
    /// directory are mostly read together (a program's modules, a
    /// package's files), and their pieces lie side by side in the blob, so
    /// one request brings them for about the cost of one.
    fn neighbours(&self, n: u32) -> Vec<u32> {
        let (file, piece) = self.piece(n);
        let dir = |f: u32| {
            let path = &self.files[f as usize].path;
            &path[..path.rfind('/').map_or(0, |i| i + 1)]
        };
        let limit = piece.end + READ_AHEAD;
        let mut out = Vec::new();
        for m in n + 1..self.states.len() as u32 {
            let (next_file, next) = self.piece(m);
            if next.start < piece.end
                || next.end > limit
                || (next_file != file && dir(next_file) != dir(file))
            {
                break;
            }
            if self.states.is_missing(m) {
                out.push(m);
            }
        }
        out
    }

    /// Brings in every piece still missing, a batch of about `batch` bytes
    /// of the blob at a time, in the blob's order (an eStargz blob puts the
    /// files to prefetch first), until done or `stop` is set; then notes
    /// what it wrote. The next batch is fetched while one is written, so
    /// the link and the disk are busy at once. Returns whether the layer is
    /// complete.
    pub fn complete(&self, batch: u64, stop: &AtomicBool) -> io::Result<bool> {
        let mut missing: Vec<u32> = (0..self.states.len() as u32)
            .filter(|&n| self.states.is_missing(n))
            .collect();
        missing.sort_by_key(|&n| self.piece(n).1.start);
        let mut batches = Vec::new();
        let mut at = 0;
        while at < missing.len() {
            let first = self.piece(missing[at]).1.start;
            let mut to = at + 1;
            while to < missing.len() && self.piece(missing[to]).1.end - first <= batch {
                to += 1;
            }
            batches.push(&missing[at..to]);
            at = to;
        }
        let stopped = || stop.load(Ordering::Relaxed) || self.detached.load(Ordering::Acquire);
        let kept = std::thread::scope(|scope| -> io::Result<()> {
            let (ahead, fetched) = sync_channel(1);
            scope.spawn(move || {
                for numbers in batches {
                    if stopped() {
                        break;
                    }
                    let got = self.gather(numbers, numbers.len());
                    let failed = got.is_err();
                    if ahead.send(got).is_err() || failed {
                        break;
                    }
                }
            });
            for got in fetched {
                self.keep(&got?)?;
                if self.states.note_due(true) {
                    self.note_written()?;
                }
            }
            Ok(())
        });
        // What was written is noted even when a batch failed.
        let noted = self.note_written();
        kept?;
        noted?;
        Ok(self.is_complete())
    }

    /// Pieces `numbers` still missing, checked: each from a layer that has
    /// it already, else from the source. The first `needed` of them must
    /// come: another that cannot (brought along, ahead of a read) is left
    /// out.
    fn gather(&self, numbers: &[u32], needed: usize) -> io::Result<Vec<(u32, Vec<u8>)>> {
        let (numbers, needed): (Vec<u32>, Vec<bool>) = numbers
            .iter()
            .enumerate()
            .filter(|&(_, &n)| self.states.is_missing(n))
            .map(|(i, &n)| (n, i < needed))
            .unzip();
        let mut data: Vec<Option<Vec<u8>>> = numbers.iter().map(|&n| self.shared(n)).collect();
        let to_fetch: Vec<usize> = (0..numbers.len()).filter(|&i| data[i].is_none()).collect();
        if !to_fetch.is_empty() {
            let fetch = self.fetch.read().clone();
            let fetch = fetch.as_ref().ok_or_else(|| {
                io::Error::other(format!(
                    "lazy layer {}: no way to reach {} to fetch its data",
                    self.id, self.source.name
                ))
            })?;
            let asked: Vec<&Piece> = to_fetch.iter().map(|&i| self.piece(numbers[i]).1).collect();
            let got = fetch.fetch(&asked).map_err(|e| {
                tracing::error!(image = %self.source.name, layer = %self.id, error = %e,
                    "cannot fetch a lazy layer's data");
                io::Error::new(e.kind(), format!("{}: {e}", self.source.name))
            })?;
            if got.len() != asked.len() {
                return Err(io::Error::other(
                    "the fetcher answered a different number of pieces",
                ));
            }
            for (&i, bytes) in to_fetch.iter().zip(got) {
                match self.check(numbers[i], &bytes) {
                    Ok(()) => data[i] = Some(bytes),
                    Err(e) if needed[i] => return Err(e),
                    Err(_) => {}
                }
            }
        }
        // What could not be had was only brought along: left out.
        Ok(numbers
            .into_iter()
            .zip(data)
            .filter_map(|(n, bytes)| Some((n, bytes?)))
            .collect())
    }

    /// Writes checked pieces into their files, file by file. From then on
    /// reads are served from them; they are noted by
    /// [`LazyLayer::note_written`].
    fn keep(&self, got: &[(u32, Vec<u8>)]) -> io::Result<()> {
        let mut dirs = Dirs::new(&self.root)?;
        for run in got.chunk_by(|(a, _), (b, _)| self.piece(*a).0 == self.piece(*b).0) {
            let file = self.piece(run[0].0).0;
            // Another writer may have got there first.
            let pieces: Vec<(&Piece, &[u8])> = run
                .iter()
                .filter(|(n, _)| self.states.is_missing(*n))
                .map(|(n, bytes)| (self.piece(*n).1, bytes.as_slice()))
                .collect();
            if pieces.is_empty() {
                continue;
            }
            self.write(&mut dirs, file, &pieces)?;
            let store = self.store.upgrade().filter(|_| !self.is_detached());
            for (n, _) in run {
                let piece = self.piece(*n).1;
                if self.states.written(*n, piece.end - piece.start) {
                    if let Some(store) = &store {
                        store.lend(&self.me, *n, self.digests[*n as usize]);
                    }
                }
            }
        }
        Ok(())
    }

    /// Piece `n` as another layer of the store holds it, checked.
    fn shared(&self, n: u32) -> Option<Vec<u8>> {
        let digest = self.digests[n as usize];
        let (owner, m) = self.store.upgrade()?.piece(&digest)?;
        let owner = owner.upgrade()?;
        let (file, piece) = owner.piece(m);
        let fd = Dirs::new(&owner.root)
            .and_then(|mut dirs| dirs.open(&owner.files[file as usize].path, OFlags::RDONLY))
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
            image = %self.source.name, layer = %self.id, file = %path,
            at = piece.at, len = piece.len, blob_range = ?(piece.start..piece.end),
            "a lazy layer's piece does not match its digest: not used"
        );
        Err(io::Error::other(format!(
            "{}: the piece of {path} at {} does not match its digest",
            self.source.name, piece.at
        )))
    }

    /// Writes `pieces` into `file`, its times kept (the layer's file is
    /// read-only to everyone else).
    fn write(&self, dirs: &mut Dirs, file: u32, pieces: &[(&Piece, &[u8])]) -> io::Result<()> {
        let path = &self.files[file as usize].path;
        let (parent, name) = dirs.parent(path)?;
        let stat = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(io::Error::other(format!(
                "lazy layer {}: {path} is not a file",
                self.id
            )));
        }
        let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let (fd, mode_back) = match rustix::fs::openat(parent, name, flags, Mode::empty()) {
            Ok(fd) => (fd, None),
            // A daemon run as a user owns the file, whose mode may not let
            // even its owner write: write is allowed for the moment.
            Err(Errno::ACCESS) => {
                let mode =
                    Mode::from_raw_mode(stat.st_mode as _) & Mode::from_raw_mode(PERMISSIONS as _);
                rustix::fs::chmodat(parent, name, mode | Mode::WUSR, AtFlags::empty())?;
                (
                    rustix::fs::openat(parent, name, flags, Mode::empty())?,
                    Some(mode),
                )
            }
            Err(e) => return Err(e.into()),
        };
        let out = File::from(fd);
        let written = pieces
            .iter()
            .try_for_each(|(piece, bytes)| out.write_all_at(bytes, piece.at));
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
        kept?;
        Ok(())
    }

    /// Makes the pieces written so far durable (one sync for them all) and
    /// notes them; a file all of whose pieces are noted waits no more. If
    /// the sync fails they are missing again: fetched again when next
    /// needed, never served from a file that may have lost them.
    pub fn note_written(&self) -> io::Result<()> {
        // One note at a time: each is appended after its own sync.
        let mut log = self.log.lock();
        let numbers = self.states.take_unnoted();
        if numbers.is_empty() {
            return Ok(());
        }
        let durable = self
            .sync_files(&numbers)
            .and_then(|()| log.append(&numbers));
        if let Err(e) = durable {
            self.states.lost(&numbers);
            tracing::error!(layer = %self.id, pieces = numbers.len(), error = %e,
                "pieces written to a lazy layer could not be made durable: fetched again");
            return Err(e);
        }
        self.states.noted(&numbers);
        let mut files: Vec<u32> = numbers.iter().map(|&n| self.piece(n).0).collect();
        files.dedup();
        let store = self.store.upgrade().filter(|_| !self.is_detached());
        for file in files {
            if self.file_is_whole(file) {
                let key = self.keys.lock().remove(&file);
                if let (Some(key), Some(store)) = (key, &store) {
                    store.whole(key);
                }
            }
        }
        if self.is_complete() {
            log.sync()?;
            let marker = File::create(self.state.join(COMPLETE))?;
            marker.sync_all()?;
            File::open(&self.state)?.sync_all()?;
            tracing::info!(layer = %self.id, image = %self.source.name, "lazy layer complete");
        }
        Ok(())
    }

    /// Syncs the files of pieces `numbers`: on Linux the layer's whole
    /// filesystem at once, elsewhere each file.
    fn sync_files(&self, numbers: &[u32]) -> io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            let _ = numbers;
            rustix::fs::syncfs(super::tree::open_dir(&self.root)?)?;
        }
        #[cfg(not(target_os = "linux"))]
        {
            let mut dirs = Dirs::new(&self.root)?;
            let mut files: Vec<u32> = numbers.iter().map(|&n| self.piece(n).0).collect();
            files.sort_unstable();
            files.dedup();
            for file in files {
                let fd = dirs.open(&self.files[file as usize].path, OFlags::RDONLY)?;
                File::from(fd).sync_data()?;
            }
        }
        Ok(())
    }
}
