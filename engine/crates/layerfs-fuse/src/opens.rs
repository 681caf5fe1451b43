//! Open files, counted per inode, and what their opens hold.
//!
//! Passthrough: the kernel reads and writes a file's host file itself, with
//! no request to the door. It keeps one backing file per inode, and refuses
//! to mix passthrough opens with opens it serves through the door (page
//! cache) on one inode, so an inode that is open one way is opened that way
//! again until all its opens are released.
//!
//! What the kernel holds of an inode's opens outlives the door's process;
//! so does this record of them ([`crate::open_table`]), for the next
//! server of the session.
//!
//! A file removed while open: on a local filesystem a process goes on
//! reading, writing and syncing a file it holds open after its last name is
//! removed (a temporary file made and unlinked at once is a common
//! pattern). So every open inode holds its host file until its last release,
//! for the door to use once the filesystem answers `Stale` for it; where it
//! loses its last name, the filesystem keeps it for the next server too
//! (see `door/removed.rs`).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::OwnedFd;

use crate::types::FileHandle;
use layerfs_vfs::{FileId, KeptFile};

use crate::open_table::{OpenTable, Row};

/// The file handle of an open the door serves.
pub const CACHED: FileHandle = FileHandle(0);
/// The file handle of an open the kernel serves from the backing file.
pub const PASSTHROUGH: FileHandle = FileHandle(1);

struct Opens<B> {
    cached: u32,
    passthrough: u32,
    backing: Option<B>,
}

/// What the opens of one inode hold: apart from the counts, under a lock
/// of its own that is never held while anything else is taken, as the
/// filesystem asks for it in the middle of a removal
/// ([`layerfs_vfs::Holder`]), where an open may be waiting on the
/// filesystem with the counts' lock held.
#[derive(Default)]
struct Holding {
    held: Option<Held>,
    /// Whether the filesystem keeps the held file for the next server, its
    /// last name removed: let go at the last release.
    kept_removed: bool,
}

/// The host file an open holds (see [`crate::opens`]), and whether it was
/// taken for writing: a lower file held by a reader gives way to the upper
/// one a writer's copy-up made, and only a file taken for writing is
/// written through (a lower file is never changed, even where the host
/// would allow it).
#[derive(Clone)]
pub struct Held {
    pub file: KeptFile,
    pub write: bool,
}

/// A backing file's registration with the kernel, closed when dropped.
pub trait Registered {
    /// The kernel's number for it.
    fn id(&self) -> u32;
}

/// Open files by inode; `B` is the kernel's registration of a backing file
/// ([`crate::backing::Backing`]).
pub struct OpenFiles<B> {
    state: Mutex<State<B>>,
    /// Taken after `state` where both are.
    holding: Mutex<HashMap<FileId, Holding>>,
}

struct State<B> {
    by_id: HashMap<FileId, Opens<B>>,
    /// Where each change is recorded for the next server, if anywhere.
    table: Option<OpenTable>,
}

impl<B> Default for OpenFiles<B> {
    fn default() -> Self {
        OpenFiles {
            state: Mutex::new(State {
                by_id: HashMap::new(),
                table: None,
            }),
            holding: Mutex::default(),
        }
    }
}

/// How to answer an open.
pub enum Way<'a, B> {
    Cached,
    Passthrough(&'a B),
}

impl<B> OpenFiles<B> {
    /// Records one more open of `id`, which holds `held` if any, and answers
    /// `reply` with `answer`: through the door if the inode is open that way
    /// (or `backing` gives nothing), else passthrough with the inode's
    /// backing file, which `backing` registers on its first passthrough open.
    pub fn open<R>(
        &self,
        id: FileId,
        held: Option<Held>,
        reply: R,
        backing: impl FnOnce(&R) -> Option<B>,
        answer: impl FnOnce(R, Way<'_, B>),
    ) where
        B: Registered,
    {
        let mut state = self.state.lock();
        let State { by_id, table } = &mut *state;
        let opens = by_id.entry(id).or_insert(Opens {
            cached: 0,
            passthrough: 0,
            backing: None,
        });
        self.hold(id, held, false);
        if opens.cached == 0 && opens.backing.is_none() {
            opens.backing = backing(&reply);
        }
        let passthrough = opens.backing.is_some() && opens.cached == 0;
        if passthrough {
            opens.passthrough += 1;
        } else {
            opens.cached += 1;
        }
        // Recorded before the answer: counts may be high, never low.
        record(table, id, opens);
        // Answered under the lock: a release cannot close the backing file
        // between its registration and the answer.
        match &opens.backing {
            Some(b) if passthrough => answer(reply, Way::Passthrough(b)),
            _ => answer(reply, Way::Cached),
        }
    }

    /// The opens the last server of the session recorded in `table`, its
    /// backing ids adopted by `adopt` (a registration with no passthrough
    /// open left, which a server killed mid-release can leave, is adopted
    /// and closed at once).
    pub fn resume(table: OpenTable, rows: Vec<(FileId, Row)>, adopt: impl Fn(u32) -> B) -> Self
    where
        B: Registered,
    {
        let mut by_id = HashMap::new();
        for (id, row) in rows {
            let backing = (row.backing != 0).then(|| adopt(row.backing));
            let backing = backing.filter(|_| row.passthrough > 0);
            by_id.insert(
                id,
                Opens {
                    cached: row.cached,
                    passthrough: row.passthrough,
                    backing,
                },
            );
        }
        OpenFiles {
            state: Mutex::new(State {
                by_id,
                table: Some(table),
            }),
            holding: Mutex::default(),
        }
    }

    /// Records each change in `table` from now.
    pub fn with_table(self, table: OpenTable) -> Self {
        self.state.lock().table = Some(table);
        self
    }

    /// A copy of the table's descriptor, for the keeper to hold.
    pub fn table(&self) -> Option<OwnedFd> {
        let state = self.state.lock();
        let fd = state.table.as_ref()?.fd().try_clone_to_owned();
        fd.inspect_err(|e| tracing::warn!("the open-file table cannot be handed over: {e}"))
            .ok()
    }

    /// The inodes the kernel reads and writes itself (a backing file is
    /// registered), with no request to the door.
    pub fn passed_through(&self) -> Vec<FileId> {
        let state = self.state.lock();
        state
            .by_id
            .iter()
            .filter(|(_, o)| o.backing.is_some())
            .map(|(&id, _)| id)
            .collect()
    }

    /// The host file the opens of `id` hold, while it is open.
    pub fn held(&self, id: FileId) -> Option<Held> {
        self.holding.lock().get(&id)?.held.clone()
    }

    /// Has the opens of `id` hold `held` (a file taken for writing takes
    /// the place of one taken for reading), and, with `kept_removed`, notes
    /// that the filesystem keeps it, its last name removed, until the last
    /// release.
    fn hold(&self, id: FileId, held: Option<Held>, kept_removed: bool) {
        let mut holding = self.holding.lock();
        let holds = holding.entry(id).or_default();
        if let Some(held) = held.filter(|h| h.write || holds.held.is_none()) {
            holds.held = Some(held);
        }
        holds.kept_removed |= kept_removed;
    }

    /// Has the opens of `id`, if any is left, hold `held`, a file the
    /// filesystem kept for them when its last name was removed; false where
    /// none is, and the file is to be let go.
    pub fn hold_removed(&self, id: FileId, held: Held) -> bool {
        let state = self.state.lock();
        if !state.by_id.contains_key(&id) {
            return false;
        }
        self.hold(id, Some(held), true);
        true
    }

    /// Records the release of an open with file handle `fh`, once it is
    /// answered (counts may be high, never low); true where it was the last
    /// of a file the filesystem keeps removed, which it may now let go.
    pub fn release(&self, id: FileId, fh: FileHandle) -> bool
    where
        B: Registered,
    {
        let mut state = self.state.lock();
        let State { by_id, table } = &mut *state;
        let Some(opens) = by_id.get_mut(&id) else {
            return false;
        };
        if fh == PASSTHROUGH {
            opens.passthrough = opens.passthrough.saturating_sub(1);
        } else {
            opens.cached = opens.cached.saturating_sub(1);
        }
        let closing = if opens.passthrough == 0 {
            opens.backing.take()
        } else {
            None
        };
        record(table, id, opens);
        // Closes the backing file's registration with the kernel, once the
        // table no longer names it.
        drop(closing);
        if opens.passthrough > 0 || opens.cached > 0 {
            return false;
        }
        by_id.remove(&id);
        let holds = self.holding.lock().remove(&id);
        holds.is_some_and(|h| h.kept_removed)
    }
}

impl<B: Send> layerfs_vfs::Holder for OpenFiles<B> {
    fn keep(&self, id: FileId) -> Option<(KeptFile, bool)> {
        let mut holding = self.holding.lock();
        let holds = holding.get_mut(&id)?;
        let held = holds.held.as_ref()?;
        holds.kept_removed = true;
        Some((held.file.clone(), held.write))
    }
}

/// Records `opens` of `id` in the table, if there is one.
fn record<B: Registered>(table: &mut Option<OpenTable>, id: FileId, opens: &Opens<B>) {
    let Some(t) = table.as_mut() else { return };
    let row = Row {
        backing: opens.backing.as_ref().map_or(0, |b| b.id()),
        cached: opens.cached,
        passthrough: opens.passthrough,
    };
    if let Err(e) = t.set(id, row) {
        // The next server could answer opens of this inode the wrong way:
        // none is better than a wrong one.
        tracing::warn!("the open-file table could not grow ({e}): a server taking this session over will not have it");
        if let Some(t) = table.take() {
            t.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;

    impl Registered for u32 {
        fn id(&self) -> u32 {
            *self
        }
    }

    /// Opens `id` where a backing file `offered` would be registered; which
    /// way it was answered, and whether a registration was asked for.
    fn open(files: &OpenFiles<u32>, id: FileId, offered: Option<u32>) -> (Option<u32>, bool) {
        let mut asked = false;
        let mut got = None;
        files.open(
            id,
            None,
            (),
            |_| {
                asked = true;
                offered
            },
            |(), way| {
                got = match way {
                    Way::Cached => None,
                    Way::Passthrough(b) => Some(*b),
                }
            },
        );
        (got, asked)
    }

    #[test]
    fn an_inode_stays_passthrough_with_one_backing_file_while_open() {
        let files = OpenFiles::default();
        assert_eq!(open(&files, 7, Some(70)), (Some(70), true));
        assert_eq!(files.passed_through(), [7]);
        // Registered once: later opens reuse it, even where the filesystem
        // would offer nothing now.
        assert_eq!(open(&files, 7, None), (Some(70), false));
        files.release(7, PASSTHROUGH);
        assert_eq!(files.passed_through(), [7], "one open left");
        files.release(7, PASSTHROUGH);
        assert!(files.state.lock().by_id.is_empty());
        assert!(files.passed_through().is_empty());
        assert_eq!(open(&files, 7, Some(71)), (Some(71), true));
    }

    #[test]
    fn an_inode_holds_its_first_file_until_a_writer_opens_it_and_until_its_last_release() {
        let files: OpenFiles<u32> = OpenFiles::default();
        let file = || {
            let fd = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
            KeptFile::whole(Arc::new(fd))
        };
        let held = |id| {
            files
                .held(id)
                .map(|h| (h.file.whole_host().unwrap().as_raw_fd(), h.write))
        };
        let hold = |held: Option<Held>| {
            let seen = held
                .as_ref()
                .map(|h| (h.file.whole_host().unwrap().as_raw_fd(), h.write));
            files.open(7, held, (), |_| None, |(), _| {});
            seen
        };
        let reader = hold(Some(Held {
            file: file(),
            write: false,
        }));
        assert_eq!(held(7), reader);
        // A second reader (a lower file in a stack) keeps the first's.
        hold(Some(Held {
            file: file(),
            write: false,
        }));
        assert_eq!(held(7), reader);
        // A writer's file (the copy-up's) is what the inode holds from now.
        let writer = hold(Some(Held {
            file: file(),
            write: true,
        }));
        assert_ne!(writer, reader);
        assert_eq!(held(7), writer);
        assert_eq!(held(7).map(|(_, write)| write), Some(true));
        hold(Some(Held {
            file: file(),
            write: false,
        }));
        hold(None);
        assert_eq!(held(7), writer, "a reader and an open with nothing to hold");
        assert!(files.held(8).is_none(), "other inodes apart");
        for _ in 0..4 {
            files.release(7, CACHED);
            assert!(files.held(7).is_some());
        }
        files.release(7, CACHED);
        assert!(
            files.held(7).is_none(),
            "nothing held past the last release"
        );
    }

    #[test]
    fn an_inode_open_through_the_door_is_not_mixed_with_passthrough() {
        let files = OpenFiles::default();
        assert_eq!(open(&files, 7, None), (None, true));
        assert!(files.passed_through().is_empty(), "served by the door");
        // A write open whose copy-up made a host file: still through the
        // door while the first open lasts.
        assert_eq!(open(&files, 7, Some(70)), (None, false));
        files.release(7, CACHED);
        assert_eq!(open(&files, 7, Some(70)), (None, false));
        files.release(7, CACHED);
        files.release(7, CACHED);
        assert_eq!(open(&files, 7, Some(70)), (Some(70), true));
        assert_eq!(open(&files, 8, None), (None, true), "other inodes apart");
    }

    #[test]
    fn a_server_taking_over_answers_each_open_inode_as_the_last_one_did() {
        let table = OpenTable::new().unwrap();
        let fd = table.fd().try_clone_to_owned().unwrap();
        let last = OpenFiles::default().with_table(table);
        assert_eq!(open(&last, 7, Some(70)), (Some(70), true));
        assert_eq!(open(&last, 7, None), (Some(70), false));
        assert_eq!(open(&last, 8, None), (None, true), "served by the door");
        assert_eq!(open(&last, 9, Some(90)), (Some(90), true));
        last.release(9, PASSTHROUGH);
        // The last server is gone; the next adopts what its table says.
        let adopted = std::cell::RefCell::new(Vec::new());
        let (table, rows) = OpenTable::adopt(fd).unwrap();
        let next = OpenFiles::resume(table, rows, |id| {
            adopted.borrow_mut().push(id);
            id
        });
        assert_eq!(*adopted.borrow(), [70], "9's registration was closed");
        // 7 keeps its backing id, which a new registration would not be;
        // 8 stays with the door though a backing file is offered now.
        assert_eq!(open(&next, 7, Some(71)), (Some(70), false));
        assert_eq!(open(&next, 8, Some(80)), (None, false));
        // The releases of the last server's opens come to this one.
        for _ in 0..3 {
            next.release(7, PASSTHROUGH);
        }
        next.release(8, CACHED);
        next.release(8, CACHED);
        assert!(next.passed_through().is_empty());
        assert_eq!(open(&next, 7, Some(72)), (Some(72), true));
        assert_eq!(open(&next, 9, Some(91)), (Some(91), true));
    }
}
