//! The log of origins not yet in the inode map's database.
//!
//! A copy-up records the identity of its copy ([`super::inodes`]). Making
//! that record durable on its own costs a database commit (two `fsync`s)
//! per copy-up, where overlayfs syncs only the copy's data. So a copy-up's
//! record goes to this log instead: one `write` of one fixed-size entry,
//! which a crash of the process cannot take back (the host keeps what was
//! written), and the log is moved into the database, durably, at the next
//! point that promises durability (an fsync or COMMIT of any file, a
//! FILE_SYNC write, a commit or reset of the workspace), or once it holds
//! [`LOG_LIMIT`] entries. At start, whatever a crash left in the log is
//! moved into the database before anything is served.
//!
//! Each entry carries a checksum: a tail the host lost in a power failure
//! (zeros, or a torn last entry) ends the log there.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use layerfs_vfs::FileId;

/// Where a file's identity came from: what the log and the inode map keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    pub id: FileId,
    pub generation: u64,
}

/// Entries the log holds at most before they are moved into the database.
pub const LOG_LIMIT: usize = 4096;

/// One change to the origins table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The upper file `(tag, ino)` of host generation `host_gen` is `origin`.
    Keep {
        tag: u16,
        ino: u64,
        host_gen: u64,
        origin: Origin,
    },
    /// The upper file `(tag, ino)` is gone.
    Forget { tag: u16, ino: u64 },
}

const ENTRY: usize = 48;
const MAGIC: [u8; 4] = *b"LFSO";
const KEEP: u16 = 1;
const FORGET: u16 = 2;

impl Change {
    fn encode(&self) -> [u8; ENTRY] {
        let (kind, tag, ino, host_gen, id, generation) = match *self {
            Change::Keep {
                tag,
                ino,
                host_gen,
                origin,
            } => (KEEP, tag, ino, host_gen, origin.id, origin.generation),
            Change::Forget { tag, ino } => (FORGET, tag, ino, 0, 0, 0),
        };
        let mut e = [0u8; ENTRY];
        e[0..4].copy_from_slice(&MAGIC);
        e[4..6].copy_from_slice(&kind.to_le_bytes());
        e[6..8].copy_from_slice(&tag.to_le_bytes());
        for (i, word) in [ino, host_gen, id, generation].into_iter().enumerate() {
            e[8 + 8 * i..16 + 8 * i].copy_from_slice(&word.to_le_bytes());
        }
        let sum = crc32fast::hash(&e[..40]);
        e[40..44].copy_from_slice(&sum.to_le_bytes());
        e
    }

    /// The change `e` holds, or `None` where it is not a whole entry.
    fn decode(e: &[u8]) -> Option<Change> {
        if e.len() != ENTRY || e[0..4] != MAGIC || e[44..] != [0; 4] {
            return None;
        }
        let sum = u32::from_le_bytes(e[40..44].try_into().ok()?);
        if crc32fast::hash(&e[..40]) != sum {
            return None;
        }
        let u16_at = |i: usize| u16::from_le_bytes([e[i], e[i + 1]]);
        let u64_at = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
        let (tag, ino) = (u16_at(6), u64_at(8));
        match u16_at(4) {
            KEEP => Some(Change::Keep {
                tag,
                ino,
                host_gen: u64_at(16),
                origin: Origin {
                    id: u64_at(24),
                    generation: u64_at(32),
                },
            }),
            FORGET => Some(Change::Forget { tag, ino }),
            _ => None,
        }
    }
}

/// The changes `bytes` holds, up to the first that is not whole.
pub fn decode_all(bytes: &[u8]) -> Vec<Change> {
    bytes.chunks(ENTRY).map_while(Change::decode).collect()
}

/// The open log and the changes in it that the database does not have.
pub struct OriginLog {
    file: File,
    pub pending: Vec<Change>,
}

impl OriginLog {
    /// Opens the log at `path` (made if missing) and reads what a crash
    /// left in it: the caller moves that into the database, then calls
    /// [`OriginLog::moved`].
    pub fn open(path: &Path) -> std::io::Result<OriginLog> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(OriginLog {
            file,
            pending: decode_all(&bytes),
        })
    }

    /// Appends `changes`, in one write.
    pub fn append(&mut self, changes: &[Change]) -> std::io::Result<()> {
        let bytes: Vec<u8> = changes.iter().flat_map(Change::encode).collect();
        if let Err(e) = self.file.write_all(&bytes) {
            // A part written (a full disk) is cut off again, so entries that
            // follow are not hidden behind it.
            let whole = (self.pending.len() * ENTRY) as u64;
            let _ = self.file.set_len(whole);
            return Err(e);
        }
        self.pending.extend_from_slice(changes);
        Ok(())
    }

    /// The pending changes are durable in the database: the log starts over.
    pub fn moved(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.pending.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep(ino: u64) -> Change {
        Change::Keep {
            tag: 3,
            ino,
            host_gen: 9,
            origin: Origin {
                id: 1 << 48 | ino,
                generation: 4,
            },
        }
    }

    #[test]
    fn entries_read_back_and_a_damaged_tail_ends_the_log() {
        let changes = [keep(7), Change::Forget { tag: 3, ino: 7 }, keep(8)];
        let mut bytes: Vec<u8> = changes.iter().flat_map(Change::encode).collect();
        assert_eq!(decode_all(&bytes), changes);
        // A torn last entry, then zeros a power failure left.
        let whole = bytes.clone();
        bytes.truncate(bytes.len() - 5);
        assert_eq!(decode_all(&bytes), changes[..2]);
        let mut zeros = whole.clone();
        zeros.extend_from_slice(&[0; ENTRY * 2]);
        assert_eq!(decode_all(&zeros), changes);
        // One bit flipped in the second entry ends the log before it.
        let mut flipped = whole;
        flipped[ENTRY + 9] ^= 1;
        assert_eq!(decode_all(&flipped), changes[..1]);
    }

    #[test]
    fn the_log_keeps_appends_across_a_reopen_until_moved() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("log");
        let mut log = OriginLog::open(&path).unwrap();
        assert!(log.pending.is_empty());
        log.append(&[keep(1)]).unwrap();
        log.append(&[keep(2), Change::Forget { tag: 3, ino: 1 }])
            .unwrap();
        drop(log);
        let mut log = OriginLog::open(&path).unwrap();
        assert_eq!(
            log.pending,
            [keep(1), keep(2), Change::Forget { tag: 3, ino: 1 }]
        );
        log.moved().unwrap();
        log.append(&[keep(5)]).unwrap();
        drop(log);
        assert_eq!(OriginLog::open(&path).unwrap().pending, [keep(5)]);
    }
}
