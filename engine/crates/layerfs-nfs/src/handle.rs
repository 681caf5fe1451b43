//! File handles: what a client holds to name a file.
//!
//! Layout (25 bytes, within NFSv3's 64): version, export id, file id and the
//! file's generation, all big-endian. The file id and generation come from
//! the filesystem, so a handle outlives a server restart for as long as its
//! file exists, and a file deleted and replaced under the same id is told
//! apart (STALE) by its generation.

use layerfs_vfs::FileId;

use crate::Error;

const VERSION: u8 = 1;
/// Bytes in a handle.
pub const LEN: usize = 25;

impl FileHandle {
    pub const LEN: usize = LEN;

    /// The export a handle belongs to; a malformed handle is BADHANDLE.
    pub fn export_of(bytes: &[u8]) -> Result<u64, Error> {
        if bytes.len() != LEN || bytes[0] != VERSION {
            return Err(Error::BadHandle);
        }
        Ok(u64::from_be_bytes(bytes[1..9].try_into().expect("8 bytes")))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHandle {
    pub export: u64,
    pub fileid: FileId,
    pub generation: u64,
}

impl FileHandle {
    pub fn encode(&self) -> Vec<u8> {
        self.bytes().to_vec()
    }

    pub fn bytes(&self) -> [u8; LEN] {
        let mut out = [0; LEN];
        out[0] = VERSION;
        out[1..9].copy_from_slice(&self.export.to_be_bytes());
        out[9..17].copy_from_slice(&self.fileid.to_be_bytes());
        out[17..25].copy_from_slice(&self.generation.to_be_bytes());
        out
    }

    /// Decodes a handle of export `export`: a malformed handle is BADHANDLE,
    /// another export's is STALE.
    pub fn decode(bytes: &[u8], export: u64) -> Result<FileHandle, Error> {
        if bytes.len() != LEN || bytes[0] != VERSION {
            return Err(Error::BadHandle);
        }
        let word = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let handle = FileHandle {
            export: word(1),
            fileid: word(9),
            generation: word(17),
        };
        if handle.export != export {
            return Err(Error::Fs(layerfs_vfs::Error::Stale));
        }
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_round_trips_and_fits_nfsv3() {
        let h = FileHandle {
            export: 7,
            fileid: 42,
            generation: 99,
        };
        let bytes = h.encode();
        assert!(bytes.len() <= 64);
        assert_eq!(FileHandle::decode(&bytes, 7), Ok(h));
    }

    #[test]
    fn malformed_and_foreign_handles_are_refused() {
        let bytes = FileHandle {
            export: 7,
            fileid: 42,
            generation: 99,
        }
        .encode();
        assert_eq!(FileHandle::decode(&bytes[..24], 7), Err(Error::BadHandle));
        assert_eq!(FileHandle::decode(&[], 7), Err(Error::BadHandle));
        let mut wrong_version = bytes.clone();
        wrong_version[0] = 2;
        assert_eq!(FileHandle::decode(&wrong_version, 7), Err(Error::BadHandle));
        assert_eq!(
            FileHandle::decode(&bytes, 8),
            Err(Error::Fs(layerfs_vfs::Error::Stale))
        );
    }
}
