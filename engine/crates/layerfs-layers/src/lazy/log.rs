//! `filled`: the log of which pieces of a lazy layer are in.
//!
//! ```text
//! header   8 bytes   "LFSFILL2"
//! record   8 bytes   piece number (u32 LE), CRC-32 of those 4 bytes (u32 LE)
//! ```
//!
//! A record is appended only once its piece's data is durable, and is
//! written at the end of the last whole record (a positioned write, never
//! `O_APPEND`): a record torn by a kill, a crash or a full disk is written
//! over by the next one, never followed by it. A log is read up to its
//! first record that does not check (a torn tail, or the zeros a crash can
//! leave in a file's last block) and cut there before anything is written,
//! so no record is ever read shifted. What is cut is only pieces fetched
//! again.
//!
//! The log of an earlier layerfs was bare 4-byte records appended in
//! `O_APPEND` mode, after any torn tail: it may be read shifted. Such a log
//! is read once, each piece it names is checked against its digest in the
//! layer's file, and the log is rewritten with the pieces that match.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const HEADER: &[u8; 8] = b"LFSFILL2";
const RECORD: usize = 8;

/// The log, open for writing at the end of its last whole record.
pub(super) struct Log {
    file: File,
    path: PathBuf,
    /// Where the next record goes: the end of the last whole one.
    end: u64,
}

/// What a log said when opened.
pub(super) enum Noted {
    /// Pieces its checked records name.
    Checked(Vec<u32>),
    /// Pieces an earlier layerfs's log may name: to be checked against
    /// their data, then kept with [`Log::rewrite`].
    Unchecked(Vec<u32>),
}

fn record(n: u32) -> [u8; RECORD] {
    let number = n.to_le_bytes();
    let check = crc32fast::hash(&number).to_le_bytes();
    let mut out = [0; RECORD];
    out[..4].copy_from_slice(&number);
    out[4..].copy_from_slice(&check);
    out
}

/// The piece a record names, if it checks.
fn read_record(bytes: &[u8]) -> Option<u32> {
    let number: [u8; 4] = bytes.get(..4)?.try_into().ok()?;
    let check: [u8; 4] = bytes.get(4..RECORD)?.try_into().ok()?;
    (crc32fast::hash(&number) == u32::from_le_bytes(check)).then_some(u32::from_le_bytes(number))
}

/// The pieces `bytes` (a log after its header) names, and where its last
/// whole record that checks ends.
fn records(bytes: &[u8]) -> (Vec<u32>, usize) {
    let mut pieces = Vec::with_capacity(bytes.len() / RECORD);
    let mut end = 0;
    while let Some(n) = bytes.get(end..end + RECORD).and_then(read_record) {
        pieces.push(n);
        end += RECORD;
    }
    (pieces, end)
}

impl Log {
    /// Opens the log at `path` (made if missing) and reads what it notes.
    /// A tail that does not check is cut first.
    pub(super) fn open(path: &Path) -> io::Result<(Log, Noted)> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        if let Some(body) = bytes.strip_prefix(HEADER.as_slice()) {
            let (pieces, whole) = records(body);
            let file = OpenOptions::new().write(true).open(path)?;
            let end = (HEADER.len() + whole) as u64;
            if bytes.len() as u64 != end {
                tracing::info!(log = %path.display(), cut = bytes.len() as u64 - end,
                    "a lazy layer's log ends in a record that does not check: cut");
                file.set_len(end)?;
                file.sync_data()?;
            }
            let log = Log {
                file,
                path: path.to_path_buf(),
                end,
            };
            return Ok((log, Noted::Checked(pieces)));
        }
        // A header cut short (or no file): nothing noted yet.
        if HEADER.starts_with(&bytes) {
            return Ok((Self::rewrite(path, &[])?, Noted::Checked(Vec::new())));
        }
        let earlier = bytes
            .chunks_exact(4)
            .map(|r| u32::from_le_bytes(r.try_into().expect("4 bytes")))
            .collect();
        let file = OpenOptions::new().write(true).open(path)?;
        // Nothing is appended to it: it is rewritten before its first use.
        let log = Log {
            file,
            path: path.to_path_buf(),
            end: u64::MAX,
        };
        Ok((log, Noted::Unchecked(earlier)))
    }

    /// Replaces the log at `path` with one that notes `pieces`: written
    /// aside, synced, renamed over it, its directory synced.
    pub(super) fn rewrite(path: &Path, pieces: &[u32]) -> io::Result<Log> {
        let aside = path.with_extension("new");
        let mut bytes = Vec::with_capacity(HEADER.len() + pieces.len() * RECORD);
        bytes.extend_from_slice(HEADER);
        pieces
            .iter()
            .for_each(|&n| bytes.extend_from_slice(&record(n)));
        let mut out = File::create(&aside)?;
        out.write_all(&bytes)?;
        out.sync_all()?;
        std::fs::rename(&aside, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(Log {
            file: out,
            path: path.to_path_buf(),
            end: bytes.len() as u64,
        })
    }

    /// Notes `pieces`, whose data is durable. Not synced: a record lost
    /// is a piece fetched again. A write that fails part way is undone
    /// where the host lets it, and is written over by the next one anyway.
    pub(super) fn append(&mut self, pieces: &[u32]) -> io::Result<()> {
        if pieces.is_empty() {
            return Ok(());
        }
        if self.end == u64::MAX {
            return Err(io::Error::other(format!(
                "{}: an earlier layerfs's log, not rewritten yet",
                self.path.display()
            )));
        }
        let mut bytes = Vec::with_capacity(pieces.len() * RECORD);
        pieces
            .iter()
            .for_each(|&n| bytes.extend_from_slice(&record(n)));
        match self.file.write_all_at(&bytes, self.end) {
            Ok(()) => {
                self.end += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.end);
                Err(e)
            }
        }
    }

    pub(super) fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(noted: Noted) -> Vec<u32> {
        match noted {
            Noted::Checked(pieces) => pieces,
            Noted::Unchecked(_) => panic!("read as an earlier layerfs's log"),
        }
    }

    /// A log written by hand, byte by byte: the header, then records.
    fn by_hand(pieces: &[u32]) -> Vec<u8> {
        let mut bytes = HEADER.to_vec();
        for &n in pieces {
            bytes.extend_from_slice(&n.to_le_bytes());
            bytes.extend_from_slice(&crc32fast::hash(&n.to_le_bytes()).to_le_bytes());
        }
        bytes
    }

    #[test]
    fn a_log_torn_at_every_byte_and_appended_to_reads_every_whole_record_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("filled");
        // Low and high numbers, one past 65,536 and one near u32's top.
        let before = [0u32, 1, 255, 256, 65_535, 65_536, 70_001, 4_000_000_000];
        let after = [7u32, 65_537, 3];
        let whole = by_hand(&before);
        for cut in 0..=whole.len() {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let (mut log, noted) = Log::open(&path).unwrap();
            let kept = cut.saturating_sub(HEADER.len()) / RECORD;
            assert_eq!(checked(noted), before[..kept], "cut at {cut}");
            log.append(&after).unwrap();
            drop(log);
            // Two more openings, as two restarts of the daemon make.
            for _ in 0..2 {
                let (_, noted) = Log::open(&path).unwrap();
                let mut want = before[..kept].to_vec();
                want.extend_from_slice(&after);
                assert_eq!(checked(noted), want, "cut at {cut}, then appended");
            }
        }
    }

    #[test]
    fn zeros_a_crash_leaves_at_the_end_note_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("filled");
        let mut bytes = by_hand(&[5, 6]);
        bytes.extend_from_slice(&[0; 4096]);
        std::fs::write(&path, &bytes).unwrap();
        let (_, noted) = Log::open(&path).unwrap();
        assert_eq!(checked(noted), [5, 6]);
        assert_eq!(std::fs::read(&path).unwrap(), by_hand(&[5, 6]), "cut");
    }

    #[test]
    fn a_write_that_fails_part_way_is_written_over_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("filled");
        let (mut log, _) = Log::open(&path).unwrap();
        log.append(&[1]).unwrap();
        // What a write cut short by a full disk leaves past the end.
        log.file.write_all_at(&record(2)[..3], log.end).unwrap();
        log.append(&[3]).unwrap();
        drop(log);
        assert_eq!(checked(Log::open(&path).unwrap().1), [1, 3]);
    }

    #[test]
    fn an_earlier_layerfs_log_is_left_unchecked_and_never_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("filled");
        let mut earlier = Vec::new();
        for n in [0u32, 9, 300] {
            earlier.extend_from_slice(&n.to_le_bytes());
        }
        earlier.extend_from_slice(&[1, 2]);
        std::fs::write(&path, &earlier).unwrap();
        let (mut log, noted) = Log::open(&path).unwrap();
        let Noted::Unchecked(pieces) = noted else {
            panic!("trusted")
        };
        assert_eq!(pieces, [0, 9, 300]);
        assert!(log.append(&[4]).is_err());
        let mut log = Log::rewrite(&path, &[9]).unwrap();
        log.append(&[4]).unwrap();
        assert_eq!(checked(Log::open(&path).unwrap().1), [9, 4]);
    }
}
