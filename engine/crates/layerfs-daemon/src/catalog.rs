//! What a store holds beyond its files, in one redb database: workspaces
//! (their layers, export id and mount), notes on committed layers, and the
//! NFS port. Each change is one transaction, durable when it returns.

use std::io;
use std::path::{Path, PathBuf};

use layerfs_layers::redb_file::RedbFile;
use layerfs_registry::BlobInfo;
use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

const WORKSPACES: TableDefinition<&str, &[u8]> = TableDefinition::new("workspaces");
const LAYER_NOTES: TableDefinition<&str, &[u8]> = TableDefinition::new("layer_notes");
const SETTINGS: TableDefinition<&str, u64> = TableDefinition::new("settings");
/// Images by full reference.
const IMAGES: TableDefinition<&str, &[u8]> = TableDefinition::new("images");
/// The layer holding each uncompressed layer digest (an image's `diff_id`).
const DIFF_IDS: TableDefinition<&str, &str> = TableDefinition::new("diff_ids");
/// The registry blobs each layer is known as (pulled as, or pushed as).
const LAYER_BLOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("layer_blobs");
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
    /// The image (its full reference) whose layers are its first ones:
    /// the one it, or the workspace it was made from, was made from. A
    /// push carries that image's config on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Seconds since the epoch.
    pub created: u64,
    pub mount: Option<MountRecord>,
    /// What its upper may hold, in bytes (`StackFs::set_size_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<u64>,
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

/// An image pulled from a registry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The digest of its manifest.
    pub digest: String,
    /// Its layers, bottom first.
    pub layers: Vec<String>,
    /// Its layers' blobs in the registry, bottom first.
    pub blobs: Vec<String>,
    pub diff_ids: Vec<String>,
    /// Its blobs' bytes.
    pub size: u64,
    pub created: u64,
    /// `os/arch[/variant]`; empty for an image recorded before platforms
    /// were.
    #[serde(default)]
    pub platform: String,
    /// Its config, as the registry sent it (none for an image recorded
    /// before configs were): a push of work over it carries it on.
    #[serde(default)]
    pub config: Option<String>,
}

pub struct Catalog {
    db: RedbFile,
}

/// The catalog's error, of the host's kind where the host failed (a full
/// disk stays a full disk).
fn db_error(e: impl Into<redb::Error>) -> io::Error {
    match e.into() {
        redb::Error::Io(io) => io::Error::new(io.kind(), format!("catalog: {io}")),
        e => io::Error::other(format!("catalog: {e}")),
    }
}

impl Catalog {
    pub fn open(path: &Path) -> io::Result<Catalog> {
        let catalog = Catalog {
            db: RedbFile::open(path).map_err(db_error)?,
        };
        catalog.write(|txn| {
            txn.open_table(WORKSPACES)?;
            txn.open_table(LAYER_NOTES)?;
            txn.open_table(SETTINGS)?;
            txn.open_table(IMAGES)?;
            txn.open_table(DIFF_IDS)?;
            txn.open_table(LAYER_BLOBS)?;
            Ok(())
        })?;
        Ok(catalog)
    }

    pub fn workspaces(&self) -> io::Result<Vec<(String, WorkspaceRecord)>> {
        self.all(WORKSPACES)
    }

    /// Every row of `table`, decoded.
    fn all<T: serde::de::DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> io::Result<Vec<(String, T)>> {
        let rows = self.db.read(|txn| {
            let mut rows = Vec::new();
            for row in txn.open_table(table)?.iter()? {
                let (name, record) = row?;
                rows.push((name.value().to_string(), record.value().to_vec()));
            }
            Ok(rows)
        });
        let rows = rows.map_err(db_error)?;
        rows.into_iter()
            .map(|(name, record)| Ok((name, decode(&record)?)))
            .collect()
    }

    pub fn images(&self) -> io::Result<Vec<(String, ImageRecord)>> {
        self.all(IMAGES)
    }

    pub fn image(&self, reference: &str) -> io::Result<Option<ImageRecord>> {
        self.get(IMAGES, reference)?
            .map(|record| decode(&record))
            .transpose()
    }

    /// Records `image` under `reference`, and which layer holds each of its
    /// `diff_id`s, in one transaction.
    pub fn put_image(&self, reference: &str, image: &ImageRecord) -> io::Result<()> {
        let bytes = serde_json::to_vec(image)?;
        self.write(|txn| {
            txn.open_table(IMAGES)?
                .insert(reference, bytes.as_slice())?;
            let mut diff_ids = txn.open_table(DIFF_IDS)?;
            for (diff_id, layer) in image.diff_ids.iter().zip(&image.layers) {
                diff_ids.insert(diff_id.as_str(), layer.as_str())?;
            }
            Ok(())
        })
    }

    pub fn remove_image(&self, reference: &str) -> io::Result<()> {
        self.write(|txn| {
            txn.open_table(IMAGES)?.remove(reference)?;
            Ok(())
        })
    }

    /// The registry blobs `layer` is known as.
    pub fn layer_blobs(&self, layer: &str) -> io::Result<Vec<BlobInfo>> {
        match self.get(LAYER_BLOBS, layer)? {
            Some(blobs) => decode(&blobs),
            None => Ok(Vec::new()),
        }
    }

    /// Adds `blob` to those `layer` is known as.
    pub fn add_layer_blob(&self, layer: &str, blob: &BlobInfo) -> io::Result<()> {
        let mut blobs = self.layer_blobs(layer)?;
        if blobs.contains(blob) {
            return Ok(());
        }
        blobs.push(blob.clone());
        let bytes = serde_json::to_vec(&blobs)?;
        self.write(|txn| {
            txn.open_table(LAYER_BLOBS)?
                .insert(layer, bytes.as_slice())?;
            Ok(())
        })
    }

    /// The layer recorded as holding `diff_id`, if any.
    pub fn layer_of_diff_id(&self, diff_id: &str) -> io::Result<Option<String>> {
        self.db
            .read(|txn| {
                Ok(txn
                    .open_table(DIFF_IDS)?
                    .get(diff_id)?
                    .map(|layer| layer.value().to_string()))
            })
            .map_err(db_error)
    }

    pub fn workspace(&self, name: &str) -> io::Result<Option<WorkspaceRecord>> {
        self.get(WORKSPACES, name)?
            .map(|record| decode(&record))
            .transpose()
    }

    pub fn put_workspace(&self, name: &str, record: &WorkspaceRecord) -> io::Result<()> {
        let bytes = serde_json::to_vec(record)?;
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
        match self.get(LAYER_NOTES, layer)? {
            Some(note) => decode(&note),
            None => Ok(LayerNote::default()),
        }
    }

    pub fn put_note(&self, layer: &str, note: &LayerNote) -> io::Result<()> {
        let bytes = serde_json::to_vec(note)?;
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
        let port = self
            .db
            .read(|txn| Ok(txn.open_table(SETTINGS)?.get(NFS_PORT)?.map(|p| p.value())));
        Ok(port.map_err(db_error)?.and_then(|p| u16::try_from(p).ok()))
    }

    pub fn set_nfs_port(&self, port: u16) -> io::Result<()> {
        self.write(|txn| {
            txn.open_table(SETTINGS)?
                .insert(NFS_PORT, u64::from(port))?;
            Ok(())
        })
    }

    /// The bytes kept under `key` in `table`.
    fn get(&self, table: TableDefinition<&str, &[u8]>, key: &str) -> io::Result<Option<Vec<u8>>> {
        self.db
            .read(|txn| Ok(txn.open_table(table)?.get(key)?.map(|v| v.value().to_vec())))
            .map_err(db_error)
    }

    fn write(
        &self,
        change: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> io::Result<()> {
        self.db.write(change).map_err(db_error)
    }
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| io::Error::other(format!("catalog: {e}")))
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
            image: Some("registry.example/team/base:v1".into()),
            created: 1,
            mount: Some(MountRecord {
                path: "/mnt/x".into(),
                door: Door::Fuse,
            }),
            size_limit: Some(64 << 20),
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
