//! The lazy layers a process has attached: which host files wait for
//! data (found by their device and inode, whichever stack reads them), and
//! which pieces any layer has, for another to copy.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use super::{Fetch, LazyLayer};
use crate::LayerId;

/// A host file's (device, inode).
pub(super) type HostKey = (u64, u64);

/// A file of a lazy layer, by its number; a piece, by its number.
type InLayer = (Arc<LazyLayer>, u32);
type PieceIn = (Weak<LazyLayer>, u32);

/// Every lazy layer the process has attached.
pub(super) struct Attached {
    /// Files still waiting for data, by host (device, inode).
    pub waiting: RwLock<FxHashMap<HostKey, InLayer>>,
    /// `waiting.len()`, read without the lock.
    pub count: AtomicUsize,
    /// Every piece written in any layer, by digest: where another layer
    /// can copy it from.
    pub pieces: RwLock<FxHashMap<[u8; 32], PieceIn>>,
    pub layers: Mutex<FxHashMap<LayerId, Arc<LazyLayer>>>,
}

pub(super) static ATTACHED: LazyLock<Attached> = LazyLock::new(|| Attached {
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
    let layer = Arc::new(LazyLayer::load(id, root, state, fetch)?);
    // Every waiting file found before anything is registered: a layer
    // that cannot be attached leaves no trace.
    let keys = layer.waiting_files()?;
    {
        let mut shared = ATTACHED.pieces.write();
        for n in layer.filled_pieces() {
            shared
                .entry(layer.digest(n))
                .or_insert((Arc::downgrade(&layer), n));
        }
    }
    let mut waiting = ATTACHED.waiting.write();
    for (&file, &key) in &keys {
        waiting.insert(key, (layer.clone(), file));
    }
    ATTACHED.count.store(waiting.len(), Ordering::Release);
    *layer.keys.lock() = keys;
    drop(waiting);
    layers.insert(id.clone(), layer.clone());
    Ok(layer)
}

/// Forgets lazy layer `id` (it is being removed).
pub(crate) fn detach(id: &LayerId) {
    let Some(layer) = ATTACHED.layers.lock().remove(id) else {
        return;
    };
    layer.detach();
    let mut waiting = ATTACHED.waiting.write();
    for key in layer.keys.lock().drain().map(|(_, key)| key) {
        waiting.remove(&key);
    }
    ATTACHED.count.store(waiting.len(), Ordering::Release);
    ATTACHED.pieces.write().retain(|_, (owner, _)| {
        owner.strong_count() > 0 && !Weak::ptr_eq(owner, &Arc::downgrade(&layer))
    });
}
