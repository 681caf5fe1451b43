//! A redb database that recovers from a failed write.
//!
//! After a write fails in the host (a full disk, a quota), redb refuses
//! every later transaction until the database is opened again. So the handle
//! is dropped then, and the next transaction reopens the file, which repairs
//! it: the database works again as soon as the host does.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use redb::{Database, DatabaseError, ReadTransaction, ReadableDatabase, WriteTransaction};

pub struct RedbFile {
    path: PathBuf,
    open: Mutex<Option<Database>>,
}

impl RedbFile {
    /// Opens the database at `path`, made if missing.
    pub fn open(path: &Path) -> Result<RedbFile, DatabaseError> {
        let db = Database::create(path)?;
        Ok(RedbFile {
            path: path.to_owned(),
            open: Mutex::new(Some(db)),
        })
    }

    /// Runs `change` in one write transaction and commits it durably.
    pub fn write<T>(
        &self,
        change: impl FnOnce(&WriteTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, redb::Error> {
        self.with(|db| {
            let txn = db.begin_write()?;
            let value = change(&txn)?;
            txn.commit()?;
            Ok(value)
        })
    }

    /// Runs `look` on a snapshot of the database.
    pub fn read<T>(
        &self,
        look: impl FnOnce(&ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, redb::Error> {
        self.with(|db| look(&db.begin_read()?))
    }

    fn with<T>(
        &self,
        run: impl FnOnce(&Database) -> Result<T, redb::Error>,
    ) -> Result<T, redb::Error> {
        let mut open = self.open.lock();
        let db = match &mut *open {
            Some(db) => db,
            closed => closed.insert(Database::create(&self.path)?),
        };
        let result = run(db);
        if let Err(redb::Error::Io(_) | redb::Error::PreviousIo) = &result {
            *open = None;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layerfs_testkit::{or_skip, Mounted};
    use redb::TableDefinition;
    use std::io::Write;

    const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");

    #[test]
    fn writes_work_again_once_a_full_disk_has_room() {
        let dir = tempfile::tempdir().unwrap();
        let Some(_fs) = or_skip(Mounted::tmpfs(dir.path(), "1m"), "a 1 MiB filesystem") else {
            return;
        };
        let db = RedbFile::open(&dir.path().join("db")).unwrap();
        let put = |k: u64| {
            db.write(|txn| {
                txn.open_table(T)?.insert(k, [7u8; 2048].as_slice())?;
                Ok(())
            })
        };
        put(0).unwrap();
        let filler = std::fs::File::create(dir.path().join("filler")).unwrap();
        while (&filler).write_all(&[0u8; 4096]).is_ok() {}
        let failed = (1..200)
            .find_map(|k| put(k).err())
            .expect("the disk never filled");
        assert!(
            matches!(&failed, redb::Error::Io(e) if e.kind() == std::io::ErrorKind::StorageFull),
            "{failed}"
        );
        drop(filler);
        std::fs::remove_file(dir.path().join("filler")).unwrap();
        put(1000).unwrap();
        let kept = db
            .read(|txn| Ok(txn.open_table(T)?.get(0)?.map(|v| v.value().len())))
            .unwrap();
        assert_eq!(kept, Some(2048));
    }
}
