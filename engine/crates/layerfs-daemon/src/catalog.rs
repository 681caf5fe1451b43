//! What a store holds beyond its files, in one redb database: workspaces
//! (their layers, export id and mount), notes on committed layers, and the
//! NFS port. Each change is one transaction, durable when it returns.

use std::io;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const WORKSPACES: TableDefinition<&str, &[u8]> = TableDefinition::new("workspaces");
const LAYER_NOTES: TableDefinition<&str, &[u8]> = TableDefinition::new("layer_notes");
const SETTINGS: TableDefinition<&str, u64> = TableDefinition::new("settings");
const NFS_PORT: &str = "nfs_port";

/// A workspace: what it was made from and where it is mounted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceRecord {
    /// Names the workspace in NFS handles; never reused in the store.
    pub export_id: u64,
    /// Its read-only layers, bottom first: the ones it was made from, then
    /// its commits.
    pub layers: Vec<String>,
    /// The workspace it was made from, if any.
    pub parent: Option<String>,
    /// Seconds since the epoch.
    pub created: u64,
    pub mount: Option<MountRecord>,
}

/// Where a workspace is mounted, kept so that a restarted daemon mounts it
/// again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MountRecord {
    pub path: PathBuf,
    pub door: Door,
}

/// How a workspace reaches the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Door {
    /// The kernel's NFS client, served by the daemon's NFS server.
    Nfs,
    /// FUSE (Linux), served by the daemon's threads.
    Fuse,
}

impl std::fmt::Display for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Door::Nfs => "nfs",
            Door::Fuse => "fuse",
        })
    }
}

/// Where a committed layer came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerNote {
    pub message: Option<String>,
    pub workspace: Option<String>,
    pub created: u64,
}

pub struct Catalog {
    db: Database,
}

fn db_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("catalog: {e}"))
}

impl Catalog {
    pub fn open(path: &Path) -> io::Result<Catalog> {
        let db = Database::create(path).map_err(db_error)?;
        let txn = db.begin_write().map_err(db_error)?;
        txn.open_table(WORKSPACES).map_err(db_error)?;
        txn.open_table(LAYER_NOTES).map_err(db_error)?;
        txn.open_table(SETTINGS).map_err(db_error)?;
        txn.commit().map_err(db_error)?;
        Ok(Catalog { db })
    }

    pub fn workspaces(&self) -> io::Result<Vec<(String, WorkspaceRecord)>> {
        let txn = self.db.begin_read().map_err(db_error)?;
        let table = txn.open_table(WORKSPACES).map_err(db_error)?;
        let mut all = Vec::new();
        for row in table.iter().map_err(db_error)? {
            let (name, record) = row.map_err(db_error)?;
            all.push((name.value().to_string(), decode(record.value())?));
        }
        Ok(all)
    }

    pub fn workspace(&self, name: &str) -> io::Result<Option<WorkspaceRecord>> {
        let txn = self.db.begin_read().map_err(db_error)?;
        let table = txn.open_table(WORKSPACES).map_err(db_error)?;
        match table.get(name).map_err(db_error)? {
            Some(record) => Ok(Some(decode(record.value())?)),
            None => Ok(None),
        }
    }

    pub fn put_workspace(&self, name: &str, record: &WorkspaceRecord) -> io::Result<()> {
        let bytes = serde_json::to_vec(record).map_err(db_error)?;
        self.write(|txn| {
            txn.open_table(WORKSPACES)?.insert(name, bytes.as_slice())?;
            Ok(())
        })
    }

    pub fn remove_workspace(&self, name: &str) -> io::Result<()> {
        self.write(|txn| {
            txn.open_table(WORKSPACES)?.remove(name)?;
            Ok(())
        })
    }

    pub fn note(&self, layer: &str) -> io::Result<LayerNote> {
        let txn = self.db.begin_read().map_err(db_error)?;
        let table = txn.open_table(LAYER_NOTES).map_err(db_error)?;
        match table.get(layer).map_err(db_error)? {
            Some(note) => decode(note.value()),
            None => Ok(LayerNote::default()),
        }
    }

    pub fn put_note(&self, layer: &str, note: &LayerNote) -> io::Result<()> {
        let bytes = serde_json::to_vec(note).map_err(db_error)?;
        self.write(|txn| {
            txn.open_table(LAYER_NOTES)?
                .insert(layer, bytes.as_slice())?;
            Ok(())
        })
    }

    pub fn remove_note(&self, layer: &str) -> io::Result<()> {
        self.write(|txn| {
            txn.open_table(LAYER_NOTES)?.remove(layer)?;
            Ok(())
        })
    }

    /// The port the store's NFS server listens on, once it has one.
    pub fn nfs_port(&self) -> io::Result<Option<u16>> {
        let txn = self.db.begin_read().map_err(db_error)?;
        let table = txn.open_table(SETTINGS).map_err(db_error)?;
        let port = table.get(NFS_PORT).map_err(db_error)?;
        Ok(port.and_then(|p| u16::try_from(p.value()).ok()))
    }

    pub fn set_nfs_port(&self, port: u16) -> io::Result<()> {
        self.write(|txn| {
            txn.open_table(SETTINGS)?
                .insert(NFS_PORT, u64::from(port))?;
            Ok(())
        })
    }

    fn write(
        &self,
        change: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> io::Result<()> {
        let txn = self.db.begin_write().map_err(db_error)?;
        change(&txn).map_err(db_error)?;
        txn.commit().map_err(db_error)
    }
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(db_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let record = WorkspaceRecord {
            export_id: 7,
            layers: vec!["ab".into()],
            parent: None,
            created: 1,
            mount: Some(MountRecord {
                path: "/mnt/x".into(),
                door: Door::Fuse,
            }),
        };
        {
            let catalog = Catalog::open(&path).unwrap();
            catalog.put_workspace("w", &record).unwrap();
            catalog.set_nfs_port(2049).unwrap();
            catalog.put_workspace("gone", &record).unwrap();
            catalog.remove_workspace("gone").unwrap();
        }
        let catalog = Catalog::open(&path).unwrap();
        assert_eq!(catalog.workspaces().unwrap(), vec![("w".into(), record)]);
        assert_eq!(catalog.nfs_port().unwrap(), Some(2049));
        assert_eq!(catalog.workspace("gone").unwrap(), None);
    }
}
