//! Striped locks: changes to one file are serialised, so the attributes
//! taken before and after a change bracket exactly that change (NFS clients
//! trust them to tell whether their cache is still good).

use parking_lot::{Mutex, MutexGuard};

use crate::FileId;

/// Locks per filesystem; ids share them by their remainder.
const STRIPES: usize = 64;

pub struct Stripes(Vec<Mutex<()>>);

/// Held while one or two ids are changed.
pub type Held<'a> = (MutexGuard<'a, ()>, Option<MutexGuard<'a, ()>>);

impl Default for Stripes {
    fn default() -> Stripes {
        Stripes((0..STRIPES).map(|_| Mutex::new(())).collect())
    }
}

impl Stripes {
    fn slot(id: FileId) -> usize {
        (id % STRIPES as u64) as usize
    }

    /// Locks `id`'s stripe. A panic while it was held does not poison it:
    /// the lock guards no data, only the order of changes.
    pub fn lock(&self, id: FileId) -> MutexGuard<'_, ()> {
        self.0[Self::slot(id)].lock()
    }

    /// Locks two ids' stripes in a fixed order (once if they share one).
    pub fn lock_two(&self, a: FileId, b: FileId) -> Held<'_> {
        let (sa, sb) = (Self::slot(a), Self::slot(b));
        if sa == sb {
            return (self.lock(a), None);
        }
        let (first, second) = if sa < sb { (a, b) } else { (b, a) };
        let held = self.lock(first);
        (held, Some(self.lock(second)))
    }
}
