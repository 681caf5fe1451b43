//! Each inode's opens, written where the next server of the session finds
//! them.
//!
//! The kernel serves all opens of an inode one way while any lasts: through
//! the door (its page cache), or passthrough with one backing file. An open
//! answered the other way, or with another backing file, fails with EIO in
//! the caller (fs/fuse/iomode.c: `fuse_file_io_open`, and
//! `fuse_inode_uncached_io_start`'s check that a new backing file is the
//! inode's own). A server that takes a session over ([`crate::handover`])
//! must therefore answer as the last one did, with the backing ids it had
//! registered, which stay registered with the connection. So the door
//! records every inode's opens in a shared memory file (a memfd) that the
//! keeper holds beside the session's device, and the next server maps it
//! and goes on from it.
//!
//! A server may die at any instruction, so the table is written for that:
//! - Counts may be high, never low. An open is counted before it is
//!   answered and a release after it is: a server that dies between the two
//!   leaves one count too many (the kernel sends the open again, or the
//!   release is never counted). Too many keeps the inode served its way and
//!   its backing file registered until the unmount; too few would close a
//!   backing file the inode still uses, and every later open would fail.
//! - A slot's words are stored one by one in an order that keeps "a
//!   passthrough count above zero has a backing id" true after each store,
//!   and a slot is marked used only once its words are all written.
//!
//! Layout: slots of six native-endian `u32` words (`used`, the id's low and
//! high halves, `backing`, `cached`, `passthrough`); the file grows by
//! doubling and never shrinks while the session lives.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use layerfs_vfs::FileId;
use memmap2::MmapMut;

const WORDS: usize = 6;
const SLOT_BYTES: usize = WORDS * 4;
const USED: usize = 0;
const ID_LOW: usize = 1;
const ID_HIGH: usize = 2;
const BACKING: usize = 3;
const CACHED: usize = 4;
const PASSTHROUGH: usize = 5;
/// The first size of a table: 170 slots.
const FIRST_BYTES: u64 = 4096;

/// One inode's opens, as the table holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    /// The backing id registered for its passthrough opens; 0 for none.
    pub backing: u32,
    pub cached: u32,
    pub passthrough: u32,
}

/// The table, mapped; each inode in it has a slot of its own.
pub struct OpenTable {
    file: File,
    map: MmapMut,
    slots: HashMap<FileId, usize>,
    free: Vec<usize>,
}

impl OpenTable {
    /// A new, empty table in a memfd of its own.
    pub fn new() -> io::Result<OpenTable> {
        let fd = rustix::fs::memfd_create("layerfs-opens", rustix::fs::MemfdFlags::CLOEXEC)?;
        let file = File::from(fd);
        file.set_len(FIRST_BYTES)?;
        Self::map(file).map(|(table, _)| table)
    }

    /// The table a server of the same session left in `fd`, and its rows.
    pub fn adopt(fd: OwnedFd) -> io::Result<(OpenTable, Vec<(FileId, Row)>)> {
        Self::map(File::from(fd))
    }

    fn map(file: File) -> io::Result<(OpenTable, Vec<(FileId, Row)>)> {
        let len = file.metadata()?.len();
        if len == 0 || !len.is_multiple_of(FIRST_BYTES) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an open-file table of {len} bytes is none this door wrote"),
            ));
        }
        // SAFETY (memmap2's contract): the memfd is this session's alone,
        // shared only with servers of it, which never run at once; it only
        // grows, but for `abandon`, which drops this mapping first.
        #[allow(unsafe_code)]
        let map = unsafe { MmapMut::map_mut(&file)? };
        let mut table = OpenTable {
            file,
            map,
            slots: HashMap::new(),
            free: Vec::new(),
        };
        let mut rows = Vec::new();
        for slot in (0..table.capacity()).rev() {
            let w = |i| table.word(slot, i);
            if w(USED) == 0 {
                table.free.push(slot);
                continue;
            }
            let id = u64::from(w(ID_LOW)) | (u64::from(w(ID_HIGH)) << 32);
            let row = Row {
                backing: w(BACKING),
                cached: w(CACHED),
                passthrough: w(PASSTHROUGH),
            };
            table.slots.insert(id, slot);
            rows.push((id, row));
        }
        Ok((table, rows))
    }

    /// The memfd, for the keeper to hold.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Records `row` as the opens of `id`; a row with no opens frees its
    /// slot. Where the table cannot grow, says why: the next server may
    /// then answer an open of `id` the wrong way.
    pub fn set(&mut self, id: FileId, row: Row) -> io::Result<()> {
        if row.cached == 0 && row.passthrough == 0 {
            if let Some(slot) = self.slots.remove(&id) {
                self.store(slot, USED, 0);
                self.free.push(slot);
            }
            return Ok(());
        }
        let (slot, new) = match self.slots.get(&id) {
            Some(&slot) => (slot, false),
            None => (self.free_slot()?, true),
        };
        for (word, value) in stores(id, row, new).into_iter().flatten() {
            self.store(slot, word, value);
        }
        if new {
            self.slots.insert(id, slot);
        }
        Ok(())
    }

    /// Empties the file, which the next server then refuses: a table that
    /// missed a change could make it answer an open the wrong way, which
    /// fails the open; without one it answers as a fresh server would.
    pub fn abandon(self) {
        let OpenTable { file, map, .. } = self;
        drop(map);
        if let Err(e) = file.set_len(0) {
            tracing::warn!("the open-file table could not be emptied: {e}");
        }
    }

    fn free_slot(&mut self) -> io::Result<usize> {
        if let Some(slot) = self.free.pop() {
            return Ok(slot);
        }
        let old = self.capacity();
        let len = (self.map.len() as u64) * 2;
        self.file.set_len(len)?;
        // SAFETY: as in `map`; the old mapping is dropped for this one.
        #[allow(unsafe_code)]
        let map = unsafe { MmapMut::map_mut(&self.file)? };
        self.map = map;
        self.free.extend((old + 1..self.capacity()).rev());
        Ok(old)
    }

    fn capacity(&self) -> usize {
        self.map.len() / SLOT_BYTES
    }

    fn words(&self) -> &[AtomicU32] {
        let ptr = self.map.as_ptr().cast::<AtomicU32>();
        // SAFETY: the mapping is page-aligned, so aligned for u32, and
        // `map.len() / 4` words long; AtomicU32 has u32's layout, and every
        // access to the shared memory goes through these atomics.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(ptr, self.map.len() / 4)
        }
    }

    fn word(&self, slot: usize, i: usize) -> u32 {
        self.words()[slot * WORDS + i].load(Ordering::Acquire)
    }

    /// Stores one word: stores are made in program order (Release), so a
    /// server killed between two leaves the first.
    fn store(&self, slot: usize, i: usize, value: u32) {
        self.words()[slot * WORDS + i].store(value, Ordering::Release);
    }
}

/// The stores that record `row` for `id` in its slot (`new`: a free one),
/// in the order they are made. A backing id is stored before the counts
/// that use it and taken away after them; a new slot is marked used last.
fn stores(id: FileId, row: Row, new: bool) -> [Option<(usize, u32)>; 7] {
    let (set, unset) = match row.backing {
        0 => (None, Some((BACKING, 0))),
        b => (Some((BACKING, b)), None),
    };
    [
        new.then_some((ID_LOW, id as u32)),
        new.then_some((ID_HIGH, (id >> 32) as u32)),
        set,
        Some((CACHED, row.cached)),
        Some((PASSTHROUGH, row.passthrough)),
        unset,
        new.then_some((USED, 1)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(backing: u32, cached: u32, passthrough: u32) -> Row {
        Row {
            backing,
            cached,
            passthrough,
        }
    }

    /// The table another server would adopt from `table`'s memfd now.
    fn adopted(table: &OpenTable) -> Vec<(FileId, Row)> {
        let fd = table.fd().try_clone_to_owned().unwrap();
        let (_, mut rows) = OpenTable::adopt(fd).unwrap();
        rows.sort_by_key(|(id, _)| *id);
        rows
    }

    #[test]
    fn the_next_server_reads_every_inode_with_opens_and_none_without() {
        let mut table = OpenTable::new().unwrap();
        assert!(adopted(&table).is_empty());
        let big = (7u64 << 40) | 3;
        table.set(big, row(4, 0, 2)).unwrap();
        table.set(9, row(0, 1, 0)).unwrap();
        table.set(10, row(0, 1, 0)).unwrap();
        table.set(9, row(0, 3, 0)).unwrap();
        table.set(10, row(0, 0, 0)).unwrap();
        assert_eq!(adopted(&table), [(9, row(0, 3, 0)), (big, row(4, 0, 2))]);
        // A freed slot is used again: the table does not grow with churn.
        for id in 100..10_000 {
            table.set(id, row(1, 0, 1)).unwrap();
            table.set(id, row(0, 0, 0)).unwrap();
        }
        assert_eq!(table.map.len() as u64, FIRST_BYTES);
    }

    #[test]
    fn a_table_grows_past_its_first_page_and_keeps_its_rows() {
        let mut table = OpenTable::new().unwrap();
        let n = 3 * table.capacity() as u64;
        for id in 0..n {
            table.set(id, row(id as u32 + 1, 0, 1)).unwrap();
        }
        assert!(table.map.len() as u64 > FIRST_BYTES);
        let rows = adopted(&table);
        assert_eq!(rows.len() as u64, n);
        assert!(rows.iter().all(|&(id, r)| r == row(id as u32 + 1, 0, 1)));
        // The adopting server goes on where this one left off.
        let (mut next, _) = OpenTable::adopt(table.fd().try_clone_to_owned().unwrap()).unwrap();
        next.set(0, row(0, 0, 0)).unwrap();
        next.set(n, row(0, 2, 0)).unwrap();
        let rows = adopted(&next);
        assert_eq!(rows.len() as u64, n);
        assert_eq!(rows.last(), Some(&(n, row(0, 2, 0))));
    }

    #[test]
    fn after_each_store_a_passthrough_count_has_its_backing_id() {
        // A server killed after any store of a slot leaves the words as
        // they are then: every prefix of each change's stores is checked.
        let changes = [
            row(5, 0, 1),
            row(5, 0, 2),
            row(5, 0, 1),
            row(0, 0, 0),
            row(0, 2, 0),
            row(6, 0, 1),
            row(0, 1, 0),
        ];
        let mut words = [0u32; WORDS];
        for change in changes {
            let new = words[USED] == 0;
            if change == Row::default() {
                words[USED] = 0;
                continue;
            }
            for (word, value) in stores(7, change, new).into_iter().flatten() {
                words[word] = value;
                let used = words[USED] == 1;
                assert!(
                    !used || words[PASSTHROUGH] == 0 || words[BACKING] != 0,
                    "after storing word {word} of {change:?}: {words:?}"
                );
            }
            assert_eq!(
                (
                    words[BACKING],
                    words[CACHED],
                    words[PASSTHROUGH],
                    words[USED]
                ),
                (change.backing, change.cached, change.passthrough, 1)
            );
        }
    }

    #[test]
    fn a_file_of_another_size_is_refused() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(100).unwrap();
        let e = OpenTable::adopt(file.into()).err().unwrap();
        assert!(e.to_string().contains("100 bytes"), "{e}");
    }
}
