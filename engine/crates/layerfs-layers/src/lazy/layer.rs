//! One lazy layer: its pieces, which are in, and how a missing one is
//! brought in: from a layer that has it, else fetched; checked; written
//! with its file's times kept; synced; noted.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use super::attached::{Attached, HostKey};
use super::log::{Log, Noted};
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
    filled: Vec<AtomicBool>,
    left: AtomicUsize,
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
        let filled: Vec<AtomicBool> = digests.iter().map(|_| AtomicBool::new(false)).collect();
        let complete = state.join(COMPLETE).exists();
        let (log, noted) = Log::open(&state.join(FILLED))?;
        let mut layer = LazyLayer {
            id: id.clone(),
            root: root.to_path_buf(),
            state: state.to_path_buf(),
            source: index.source,
            files: index.files,
            first,
            digests,
            filled,
            left: AtomicUsize::new(0),
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
        for n in noted {
            if let Some(piece) = layer.filled.get(n as usize) {
                piece.store(true, Ordering::Relaxed);
            }
        }
        if complete {
            layer
                .filled
                .iter()
                .for_each(|p| p.store(true, Ordering::Relaxed));
        }
        let left = layer
            .filled
            .iter()
            .filter(|p| !p.load(Ordering::Relaxed))
            .count();
        layer.left = AtomicUsize::new(left);
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
        (0..self.filled.len() as u32).filter(|&n| self.filled[n as usize].load(Ordering::Acquire))
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

    pub(super) fn piece(&self, n: u32) -> (u32, &Piece) {
        let file = self.first.partition_point(|&first| first <= n) - 1;
        let piece = &self.files[file].pieces[(n - self.first[file]) as usize];
        (file as u32, piece)
    }

    fn file_is_whole(&self, file: u32) -> bool {
        let (from, to) = (self.first[file as usize], self.first[file as usize + 1]);
        (from..to).all(|n| self.filled[n as usize].load(Ordering::Acquire))
    }

    /// Brings in the pieces of `file` that `len` bytes at `offset` need.
    pub(super) fn fill(&self, file: u32, offset: u64, len: u64) -> io::Result<()> {
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
        let mut wanted = wanted();
        let needed = wanted.len();
        if let Some(&last) = wanted.last() {
            wanted.extend(self.neighbours(last));
        }
        self.bring(&wanted, needed)
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
        for m in n + 1..self.filled.len() as u32 {
            let (next_file, next) = self.piece(m);
            if next.start < piece.end
                || next.end > limit
                || (next_file != file && dir(next_file) != dir(file))
            {
                break;
            }
            if !self.filled[m as usize].load(Ordering::Acquire) {
                out.push(m);
            }
        }
        out
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
            self.bring(&missing[at..to], to - at)?;
            at = to;
        }
        Ok(self.is_complete())
    }

    /// Brings in pieces `numbers`: each from a layer that has it already,
    /// else from the source; checks each; writes it; notes it.
    /// The first `needed` of them must come: another that cannot (brought
    /// along, ahead of a read) is left out.
    fn bring(&self, numbers: &[u32], needed: usize) -> io::Result<()> {
        let is_missing = |&(_, n): &(usize, u32)| !self.filled[n as usize].load(Ordering::Acquire);
        let (numbers, needed): (Vec<u32>, Vec<bool>) = numbers
            .iter()
            .copied()
            .enumerate()
            .filter(is_missing)
            .map(|(i, n)| (n, i < needed))
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
        let (numbers, data): (Vec<u32>, Vec<Vec<u8>>) = numbers
            .into_iter()
            .zip(data)
            .filter_map(|(n, bytes)| Some((n, bytes?)))
            .unzip();
        // Written file by file, made durable at once (one file synced, or
        // the whole filesystem for many), then noted.
        let mut runs = Vec::new();
        let mut at = 0;
        while at < numbers.len() {
            let file = self.piece(numbers[at]).0;
            let to = at
                + numbers[at..]
                    .iter()
                    .take_while(|&&n| self.piece(n).0 == file)
                    .count();
            runs.push((file, at..to));
            at = to;
        }
        let mut dirs = Dirs::new(&self.root)?;
        let mut written = Vec::new();
        for (file, run) in &runs {
            let pieces: Vec<(&Piece, &[u8])> = run
                .clone()
                .map(|i| (self.piece(numbers[i]).1, data[i].as_slice()))
                .collect();
            written.push(self.write(&mut dirs, *file, &pieces)?);
        }
        match written.as_slice() {
            [] => {}
            [one] => one.sync_data()?,
            #[cfg(target_os = "linux")]
            [first, ..] => rustix::fs::syncfs(first)?,
            #[cfg(not(target_os = "linux"))]
            many => many.iter().try_for_each(File::sync_data)?,
        }
        for (_, run) in runs {
            self.note(&numbers[run])?;
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

    /// Writes `pieces` into `file` and makes them durable, its times kept
    /// (the layer's file is read-only to everyone else).
    fn write(&self, dirs: &mut Dirs, file: u32, pieces: &[(&Piece, &[u8])]) -> io::Result<File> {
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
        Ok(out)
    }

    /// Notes pieces `numbers` as in (their data durable already).
    fn note(&self, numbers: &[u32]) -> io::Result<()> {
        let newly: Vec<u32> = numbers
            .iter()
            .copied()
            .filter(|&n| !self.filled[n as usize].load(Ordering::Acquire))
            .collect();
        self.log.lock().append(&newly)?;
        let Some(store) = self.store.upgrade().filter(|_| !self.is_detached()) else {
            return Ok(());
        };
        for &n in &newly {
            if !self.filled[n as usize].swap(true, Ordering::AcqRel) {
                self.left.fetch_sub(1, Ordering::AcqRel);
                store.lend(&self.me, n, self.digests[n as usize]);
            }
        }
        let file = self.piece(numbers[0]).0;
        if self.file_is_whole(file) {
            let key = self.keys.lock().remove(&file);
            if let Some(key) = key {
                store.whole(key);
            }
        }
        if self.is_complete() {
            self.log.lock().sync()?;
            let marker = File::create(self.state.join(COMPLETE))?;
            marker.sync_all()?;
            File::open(&self.state)?.sync_all()?;
            tracing::info!(layer = %self.id, image = %self.source.name, "lazy layer complete");
        }
        Ok(())
    }
}
