//! Open files, counted per inode, and what their opens hold.
//!
//! Passthrough: the kernel reads and writes a file's host file itself, with
//! no request to the door. It keeps one backing file per inode, and refuses
//! to mix passthrough opens with opens it serves through the door (page
//! cache) on one inode, so an inode that is open one way is opened that way
//! again until all its opens are released.
//!
//! A file removed while open: on a local filesystem a process goes on
//! reading, writing and syncing a file it holds open after its last name is
//! removed (a temporary file made and unlinked at once is a common
//! pattern). So every open inode holds its host file until its last release,
//! for the door to use once the filesystem answers `Stale` for it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use fuser::FileHandle;
use layerfs_vfs::FileId;

/// The file handle of an open the door serves.
pub const CACHED: FileHandle = FileHandle(0);
/// The file handle of an open the kernel serves from the backing file.
pub const PASSTHROUGH: FileHandle = FileHandle(1);

struct Opens<B> {
    cached: u32,
    passthrough: u32,
    backing: Option<B>,
    held: Option<Held>,
}

/// The host file an open holds (see [`crate::opens`]), and whether it was
/// taken for writing: a lower file held by a reader gives way to the upper
/// one a writer's copy-up made, and only a file taken for writing is
/// written through (a lower file is never changed, even where the host
/// would allow it).
#[derive(Clone)]
pub struct Held {
    pub file: Arc<OwnedFd>,
    pub write: bool,
}

/// Open files by inode; `B` is the kernel's registration of a backing file
/// (`fuser::BackingId`, which closes it when dropped).
pub struct OpenFiles<B> {
    by_id: Mutex<HashMap<FileId, Opens<B>>>,
}

impl<B> Default for OpenFiles<B> {
    fn default() -> Self {
        OpenFiles {
            by_id: Mutex::default(),
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
    ) {
        let mut by_id = self.by_id.lock();
        let opens = by_id.entry(id).or_insert(Opens {
            cached: 0,
            passthrough: 0,
            backing: None,
            held: None,
        });
        if let Some(held) = held.filter(|h| h.write || opens.held.is_none()) {
            opens.held = Some(held);
        }
        if opens.cached == 0 && opens.backing.is_none() {
            opens.backing = backing(&reply);
        }
        match &opens.backing {
            Some(b) if opens.cached == 0 => {
                opens.passthrough += 1;
                // Answered under the lock: a release cannot close the
                // backing file between its registration and the answer.
                answer(reply, Way::Passthrough(b))
            }
            _ => {
                opens.cached += 1;
                answer(reply, Way::Cached)
            }
        }
    }

    /// The inodes the kernel reads and writes itself (a backing file is
    /// registered), with no request to the door.
    pub fn passed_through(&self) -> Vec<FileId> {
        let by_id = self.by_id.lock();
        by_id
            .iter()
            .filter(|(_, o)| o.backing.is_some())
            .map(|(&id, _)| id)
            .collect()
    }

    /// The host file the opens of `id` hold, while it is open.
    pub fn held(&self, id: FileId) -> Option<Held> {
        self.by_id.lock().get(&id)?.held.clone()
    }

    /// Records the release of an open with file handle `fh`.
    pub fn release(&self, id: FileId, fh: FileHandle) {
        let mut by_id = self.by_id.lock();
        let Some(opens) = by_id.get_mut(&id) else {
            return;
        };
        if fh == PASSTHROUGH {
            opens.passthrough = opens.passthrough.saturating_sub(1);
        } else {
            opens.cached = opens.cached.saturating_sub(1);
        }
        if opens.passthrough == 0 {
            // Closes the backing file's registration with the kernel.
            opens.backing = None;
        }
        if opens.passthrough == 0 && opens.cached == 0 {
            by_id.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

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
        assert!(files.by_id.lock().is_empty());
        assert!(files.passed_through().is_empty());
        assert_eq!(open(&files, 7, Some(71)), (Some(71), true));
    }

    #[test]
    fn an_inode_holds_its_first_file_until_a_writer_opens_it_and_until_its_last_release() {
        let files: OpenFiles<u32> = OpenFiles::default();
        let file = || Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        let held = |id| files.held(id).map(|h| (h.file.as_raw_fd(), h.write));
        let hold = |held: Option<Held>| {
            let seen = held.as_ref().map(|h| (h.file.as_raw_fd(), h.write));
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
}
