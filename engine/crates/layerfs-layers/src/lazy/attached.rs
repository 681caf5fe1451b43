//! The lazy layers a store has attached: which host files wait for data
//! (found by their device and inode, whichever stack of the store reads
//! them), and which pieces any of its layers has, for another to copy.
//! Each [`Store`](crate::Store) owns one: two stores in one process never
//! see each other's layers.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use super::{Fetch, LazyLayer};
use crate::LayerId;

/// A host file's (device, inode).
pub(super) type HostKey = (u64, u64);

/// A file of a lazy layer, by its number; a piece, by its number.
type InLayer = (Arc<LazyLayer>, u32);
type PieceIn = (Weak<LazyLayer>, u32);

/// Every lazy layer a store has attached.
#[derive(Default)]
pub struct Attached {
    /// Files still waiting for data, by host (device, inode).
    waiting: RwLock<FxHashMap<HostKey, InLayer>>,
    /// `waiting.len()`, read without the lock.
    count: AtomicUsize,
    /// Every piece written in any layer, by digest: where another layer
    /// can copy it from.
    pieces: RwLock<FxHashMap<[u8; 32], PieceIn>>,
    layers: Mutex<FxHashMap<LayerId, Arc<LazyLayer>>>,
    /// Host files looked up (one `fstat` each) by reads that had to ask.
    looked_up: AtomicU64,
}

impl Attached {
    /// Brings in the data a read of `len` bytes at `offset` of the lower
    /// file `fd` needs, if it is a lazy file still waiting. While no file
    /// of the store waits, this is one atomic load: no system call.
    pub fn before_read(&self, fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
        if self.count.load(Ordering::Acquire) == 0 || len == 0 {
            return Ok(());
        }
        self.looked_up.fetch_add(1, Ordering::Relaxed);
        let stat = rustix::fs::fstat(fd)?;
        #[allow(clippy::unnecessary_cast)] // stat's field types differ between platforms
        let key = (stat.st_dev as u64, stat.st_ino as u64);
        let found = self.waiting.read().get(&key).cloned();
        match found {
            Some((layer, file)) => layer.fill(file, offset, len),
            None => Ok(()),
        }
    }

    /// How many reads have looked up their host file (one system call
    /// each) to find whether it waits: none while no file of the store
    /// waits.
    pub fn files_looked_up(&self) -> u64 {
        self.looked_up.load(Ordering::Relaxed)
    }

    /// Lazy layer `id`, if attached.
    pub fn get(&self, id: &LayerId) -> Option<Arc<LazyLayer>> {
        self.layers.lock().get(id).cloned()
    }

    /// Attaches the lazy layer whose tree is `root` and state `state`;
    /// `fetch` brings what is missing (none: reads of missing data fail
    /// with EIO until a fetcher is given). A layer attached already is
    /// given `fetch`, if it is one.
    pub(crate) fn attach(
        self: &Arc<Self>,
        id: &LayerId,
        root: &Path,
        state: &Path,
        fetch: Option<Arc<dyn Fetch>>,
    ) -> io::Result<Arc<LazyLayer>> {
        let mut layers = self.layers.lock();
        if let Some(layer) = layers.get(id) {
            if let Some(fetch) = fetch {
                layer.set_fetch(fetch);
            }
            return Ok(layer.clone());
        }
        let layer = LazyLayer::load(id, root, state, fetch, Arc::downgrade(self))?;
        // Every waiting file found before anything is registered: a layer
        // that cannot be attached leaves no trace.
        let keys = layer.waiting_files()?;
        {
            let mut shared = self.pieces.write();
            for n in layer.filled_pieces() {
                shared
                    .entry(layer.digest(n))
                    .or_insert((Arc::downgrade(&layer), n));
            }
        }
        let mut waiting = self.waiting.write();
        for (&file, &key) in &keys {
            waiting.insert(key, (layer.clone(), file));
        }
        self.count.store(waiting.len(), Ordering::Release);
        *layer.keys.lock() = keys;
        drop(waiting);
        layers.insert(id.clone(), layer.clone());
        Ok(layer)
    }

    /// Notes the pieces every layer has written (`LazyLayer::note_written`):
    /// called now and then, and before the process ends, so that what a
    /// kill fetches again is bounded in time as well as in bytes. Returns
    /// the first error; every layer is tried.
    pub fn note_written(&self) -> io::Result<()> {
        let layers: Vec<Arc<LazyLayer>> = self.layers.lock().values().cloned().collect();
        let mut first = Ok(());
        for layer in layers {
            if let Err(e) = layer.note_written() {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Forgets lazy layer `id` (it is being removed).
    pub(crate) fn detach(&self, id: &LayerId) {
        let Some(layer) = self.layers.lock().remove(id) else {
            return;
        };
        layer.detach();
        let mut waiting = self.waiting.write();
        for key in layer.keys.lock().drain().map(|(_, key)| key) {
            waiting.remove(&key);
        }
        self.count.store(waiting.len(), Ordering::Release);
        self.pieces.write().retain(|_, (owner, _)| {
            owner.strong_count() > 0 && !Weak::ptr_eq(owner, &Arc::downgrade(&layer))
        });
    }

    /// Where another layer has the piece of digest `digest`.
    pub(super) fn piece(&self, digest: &[u8; 32]) -> Option<PieceIn> {
        self.pieces.read().get(digest).cloned()
    }

    /// Notes that `layer` has piece `n`, of digest `digest`, for others.
    pub(super) fn lend(&self, layer: &Weak<LazyLayer>, n: u32, digest: [u8; 32]) {
        self.pieces
            .write()
            .entry(digest)
            .or_insert((layer.clone(), n));
    }

    /// The file of host `key` waits no more.
    pub(super) fn whole(&self, key: HostKey) {
        let mut waiting = self.waiting.write();
        waiting.remove(&key);
        self.count.store(waiting.len(), Ordering::Release);
    }
}

/// A store let go of cleanly notes what its layers wrote: only a kill or a
/// crash fetches it again.
impl Drop for Attached {
    fn drop(&mut self) {
        if let Err(e) = self.note_written() {
            tracing::warn!("noting the pieces of lazy layers as their store closes: {e}");
        }
    }
}

impl layerfs_vfs::Fill for Attached {
    fn fill(&self, file: BorrowedFd<'_>, offset: u64, len: u64) -> layerfs_vfs::Result<()> {
        self.before_read(file, offset, len).map_err(|e| {
            tracing::warn!(error = %e, "a read of a lazy layer's file failed");
            layerfs_vfs::Error::Io
        })
    }
}
