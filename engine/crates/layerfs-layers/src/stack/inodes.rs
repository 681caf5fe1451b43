//! Workspace inode numbers, stable across copy-up, commit and restarts.
//!
//! Most ids are derived, not stored: a file's id is its layer's tag (16 bits)
//! above its host inode number (48 bits). Layers never change, and a layer
//! keeps its tag when an upper is committed, so these ids need no record.
//! What is stored, in one redb database, is what derivation cannot give:
//!
//! - *origins*: a copied-up file's upper inode → the id (and generation) it
//!   had below, so its handle and inode number survive the copy-up;
//! - *tags*: which tag each layer directory has;
//! - *aliases*: ids handed out for host inode numbers that do not fit 48 bits;
//! - the workspace's own random number, the root's generation.
//!
//! Each change of tags and aliases is one redb transaction, durable before
//! the operation that depends on it is made visible, so a crash at any point
//! leaves either the old or the new record. Origins of copy-ups are noted in
//! a log first and made durable in groups ([`super::origin_log`]).

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::Path;

use layerfs_vfs::{Error, FileId, Result};
use redb::{ReadableTable, TableDefinition};

pub use super::origin_log::Origin;
use super::origin_log::{Change, OriginLog, LOG_LIMIT};
use crate::redb_file::RedbFile;

/// The workspace root's id.
pub const ROOT: FileId = 1;
/// Bits of a derived id that hold the host inode number.
const HOST_BITS: u32 = 48;
const HOST_MASK: u64 = (1 << HOST_BITS) - 1;

/// (layer tag, upper host inode) → (id, generation, upper host generation).
const ORIGINS: TableDefinition<(u64, u64), (u64, u64, u64)> = TableDefinition::new("origins");
/// Layer directory (its path) → tag.
const TAGS: TableDefinition<&[u8], u64> = TableDefinition::new("tags");
/// (layer tag, host inode) → id, for host inodes past 48 bits.
const ALIASES: TableDefinition<(u64, u64), u64> = TableDefinition::new("aliases");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub struct Inodes {
    db: RedbFile,
    /// All origins, kept in memory: one per copied-up file.
    origins: RwLock<HashMap<(u16, u64), (Origin, u64)>>,
    aliases: RwLock<HashMap<(u16, u64), FileId>>,
    /// Origins noted since the database last took them.
    log: Mutex<OriginLog>,
    /// A random number naming this workspace: the root's generation.
    pub workspace: u64,
}

/// A full disk (or quota) is NOSPC (EDQUOT) to the caller; any other
/// failure of the map is EIO.
fn map_error(e: redb::Error) -> Error {
    if let redb::Error::Io(io) = &e {
        if let full @ (Error::NoSpc | Error::DQuot) =
            Error::from_errno(io.raw_os_error().unwrap_or(0))
        {
            tracing::warn!("inode map: {io}");
            return full;
        }
    }
    tracing::error!("inode map: {e}");
    Error::Io
}

impl Inodes {
    /// Opens the map at `path`, with its log beside it (`path` with the
    /// extension `log`), whose entries a crash left are moved in first.
    pub fn open(path: &Path) -> std::result::Result<Inodes, String> {
        let db = RedbFile::open(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                "in use by another layerfs serving this workspace".to_string()
            }
            e => e.to_string(),
        })?;
        let log_path = path.with_extension("log");
        let log = OriginLog::open(&log_path)
            .map_err(|e| format!("cannot read {}: {e}", log_path.display()))?;
        Self::load(db, log).map_err(|e| format!("cannot read it: {e}"))
    }

    fn load(db: RedbFile, mut log: OriginLog) -> Result<Inodes> {
        if !log.pending.is_empty() {
            tracing::info!("{} origins left in the log moved in", log.pending.len());
            write_changes(&db, &log.pending)?;
        }
        log.moved()?;
        let workspace = db
            .write(|txn| {
                let mut meta = txn.open_table(META)?;
                let existing = meta.get("workspace")?.map(|v| v.value());
                let workspace = match existing {
                    Some(w) => w,
                    None => {
                        let w = random_nonzero();
                        meta.insert("workspace", w)?;
                        w
                    }
                };
                txn.open_table(ORIGINS)?;
                txn.open_table(TAGS)?;
                txn.open_table(ALIASES)?;
                Ok(workspace)
            })
            .map_err(map_error)?;
        let (origins, aliases) = db
            .read(|read| {
                let mut origins = HashMap::new();
                for row in read.open_table(ORIGINS)?.iter()? {
                    let (k, v) = row?;
                    let ((tag, ino), (id, generation, host_gen)) = (k.value(), v.value());
                    origins.insert((tag as u16, ino), (Origin { id, generation }, host_gen));
                }
                let mut aliases = HashMap::new();
                for row in read.open_table(ALIASES)?.iter()? {
                    let (k, v) = row?;
                    let (tag, ino) = k.value();
                    aliases.insert((tag as u16, ino), v.value());
                }
                Ok((origins, aliases))
            })
            .map_err(map_error)?;
        Ok(Inodes {
            db,
            origins: RwLock::new(origins),
            aliases: RwLock::new(aliases),
            log: Mutex::new(log),
            workspace,
        })
    }

    /// The tag of the layer directory `key`, given a new one the first time.
    pub fn tag(&self, key: &[u8]) -> Result<u16> {
        // Read first: a write transaction costs a durable commit.
        let known = self
            .db
            .read(|txn| Ok(txn.open_table(TAGS)?.get(key)?.map(|t| t.value())))
            .map_err(map_error)?;
        if let Some(t) = known {
            return Ok(t as u16);
        }
        let tag = self
            .db
            .write(|txn| {
                let mut tags = txn.open_table(TAGS)?;
                if let Some(t) = tags.get(key)? {
                    return Ok(Some(t.value()));
                }
                let next = tags
                    .iter()?
                    .filter_map(|r| r.ok().map(|(_, v)| v.value()))
                    .max()
                    .unwrap_or(0)
                    + 1;
                if next > u64::from(u16::MAX) {
                    return Ok(None);
                }
                tags.insert(key, next)?;
                Ok(Some(next))
            })
            .map_err(map_error)?;
        tag.map(|t| t as u16).ok_or(Error::NoSpc)
    }

    /// The identity of the file with host inode `ino` and generation
    /// `host_gen` in the layer tagged `tag`.
    pub fn identity(&self, tag: u16, ino: u64, host_gen: Option<u64>) -> Result<Origin> {
        if let Some((origin, recorded)) = self.origins.read().get(&(tag, ino)) {
            // A record for an inode number the host has since given to
            // another file (possible only after a crash) does not apply.
            if host_gen.is_none_or(|g| g == *recorded) {
                return Ok(*origin);
            }
        }
        let id = if ino <= HOST_MASK {
            u64::from(tag) << HOST_BITS | ino
        } else {
            self.alias(tag, ino)?
        };
        Ok(Origin {
            id,
            generation: host_gen.unwrap_or(0),
        })
    }

    fn alias(&self, tag: u16, ino: u64) -> Result<FileId> {
        if let Some(id) = self.aliases.read().get(&(tag, ino)) {
            return Ok(*id);
        }
        let mut aliases = self.aliases.write();
        if let Some(id) = aliases.get(&(tag, ino)) {
            return Ok(*id);
        }
        // Tag 0 holds the root (1) and these.
        let id = aliases.values().max().map_or(ROOT + 1, |m| m + 1);
        self.db
            .write(|txn| {
                txn.open_table(ALIASES)?.insert((u64::from(tag), ino), id)?;
                Ok(())
            })
            .map_err(map_error)?;
        aliases.insert((tag, ino), id);
        Ok(id)
    }

    /// Records, durably, that the files `(tag, host inode, host generation)`
    /// carry the identities given, with every origin noted before.
    pub fn record(&self, entries: &[(u16, u64, u64, Origin)]) -> Result<()> {
        let mut log = self.log.lock();
        if entries.is_empty() && log.pending.is_empty() {
            return Ok(());
        }
        let mut changes = log.pending.clone();
        changes.extend(entries.iter().map(keep));
        write_changes(&self.db, &changes)?;
        log.moved()?;
        drop(log);
        let mut origins = self.origins.write();
        for &(tag, ino, host_gen, o) in entries {
            origins.insert((tag, ino), (o, host_gen));
        }
        Ok(())
    }

    /// Notes that the files `(tag, host inode, host generation)` carry the
    /// identities given: kept across a crash of the process at once, and
    /// durable across one of the host at the next [`Inodes::sync`].
    pub fn note(&self, entries: &[(u16, u64, u64, Origin)]) -> Result<()> {
        let changes: Vec<Change> = entries.iter().map(keep).collect();
        self.append(&changes)?;
        let mut origins = self.origins.write();
        for &(tag, ino, host_gen, o) in entries {
            origins.insert((tag, ino), (o, host_gen));
        }
        Ok(())
    }

    /// Drops the record of an upper file that is gone. Best effort: a record
    /// left behind is ignored once the host reuses the inode for a file of
    /// another generation.
    pub fn forget(&self, tag: u16, ino: u64) {
        if self.origins.write().remove(&(tag, ino)).is_none() {
            return;
        }
        if self.append(&[Change::Forget { tag, ino }]).is_err() {
            tracing::warn!("could not drop the origin of inode {ino} in layer {tag}");
        }
    }

    /// Makes every origin noted so far durable: one database commit for all
    /// of them, none when there are none.
    pub fn sync(&self) -> Result<()> {
        let mut log = self.log.lock();
        if log.pending.is_empty() {
            return Ok(());
        }
        write_changes(&self.db, &log.pending)?;
        Ok(log.moved()?)
    }

    /// Appends `changes` to the log, moving it into the database first when
    /// it is full.
    fn append(&self, changes: &[Change]) -> Result<()> {
        let mut log = self.log.lock();
        if log.pending.len() + changes.len() > LOG_LIMIT {
            write_changes(&self.db, &log.pending)?;
            log.moved()?;
        }
        Ok(log.append(changes)?)
    }
}

fn keep(&(tag, ino, host_gen, origin): &(u16, u64, u64, Origin)) -> Change {
    Change::Keep {
        tag,
        ino,
        host_gen,
        origin,
    }
}

/// Applies `changes`, in order, in one durable transaction.
fn write_changes(db: &RedbFile, changes: &[Change]) -> Result<()> {
    db.write(|txn| {
        let mut table = txn.open_table(ORIGINS)?;
        for change in changes {
            match *change {
                Change::Keep {
                    tag,
                    ino,
                    host_gen,
                    origin,
                } => {
                    table.insert(
                        (u64::from(tag), ino),
                        (origin.id, origin.generation, host_gen),
                    )?;
                }
                Change::Forget { tag, ino } => {
                    table.remove((u64::from(tag), ino))?;
                }
            }
        }
        Ok(())
    })
    .map_err(map_error)
}

fn random_nonzero() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_across_layers_and_origins_and_tags_persist() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("map");
        let map = Inodes::open(&path).unwrap();
        let (a, b) = (
            map.tag(b"/layers/a").unwrap(),
            map.tag(b"/layers/b").unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(map.tag(b"/layers/a").unwrap(), a);
        let in_a = map.identity(a, 42, Some(7)).unwrap();
        let in_b = map.identity(b, 42, Some(7)).unwrap();
        assert_ne!(in_a.id, in_b.id, "the same host inode in two layers");
        assert_ne!(in_a.id, ROOT);
        // Inode numbers past 48 bits get ids of their own, kept.
        let big = map.identity(a, u64::MAX - 3, None).unwrap();
        let big2 = map.identity(b, u64::MAX - 3, None).unwrap();
        assert_ne!(big.id, big2.id);
        assert_ne!(big.id, in_a.id);
        // A copy in layer b of the file in layer a takes its identity...
        map.record(&[(b, 99, 5, in_a)]).unwrap();
        assert_eq!(map.identity(b, 99, Some(5)).unwrap(), in_a);
        // ...but not a later file the host gives that inode number to.
        assert_ne!(map.identity(b, 99, Some(6)).unwrap().id, in_a.id);
        let workspace = map.workspace;
        drop(map);
        let map = Inodes::open(&path).unwrap();
        assert_eq!(map.workspace, workspace);
        assert_eq!(map.tag(b"/layers/b").unwrap(), b);
        assert_eq!(map.identity(b, 99, Some(5)).unwrap(), in_a);
        assert_eq!(map.identity(a, u64::MAX - 3, None).unwrap(), big);
        map.forget(b, 99);
        drop(map);
        let map = Inodes::open(&path).unwrap();
        assert_ne!(map.identity(b, 99, Some(5)).unwrap().id, in_a.id);
    }

    #[test]
    fn noted_origins_survive_a_reopen_and_sync_moves_them_into_the_database() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("map.redb");
        let log = path.with_extension("log");
        let map = Inodes::open(&path).unwrap();
        let a = map.tag(b"/layers/a").unwrap();
        let lower = map.identity(a, 42, Some(7)).unwrap();
        map.note(&[(a, 100, 3, lower)]).unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 48);
        // Dropped without a sync, as a killed process leaves it.
        drop(map);
        let map = Inodes::open(&path).unwrap();
        assert_eq!(map.identity(a, 100, Some(3)).unwrap(), lower);
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            0,
            "moved in at open"
        );
        map.note(&[(a, 101, 3, lower)]).unwrap();
        map.forget(a, 100);
        map.sync().unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        std::fs::remove_file(&log).unwrap();
        drop(map);
        let map = Inodes::open(&path).unwrap();
        assert_eq!(map.identity(a, 101, Some(3)).unwrap(), lower);
        assert_ne!(map.identity(a, 100, Some(3)).unwrap(), lower);
    }
}
