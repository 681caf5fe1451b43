//! File handles: what a client holds to name a file, and cannot forge.
//!
//! Layout (41 bytes, within NFSv3's 64): version, export id, file id, the
//! file's generation (all big-endian), then 16 bytes of a keyed MAC
//! (BLAKE3 keyed with the server's [`HandleKey`]) over the 25 bytes before.
//! The file id and generation come from the filesystem, and the key is kept
//! with the store, so a handle outlives a server restart for as long as its
//! file exists; a file deleted and replaced under the same id is told apart
//! (STALE) by its generation. A handle that is guessed, changed, or made
//! with another key is BADHANDLE: a client learns nothing from it.

use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use layerfs_vfs::FileId;

use crate::Error;

const VERSION: u8 = 2;
/// Bytes the MAC covers.
const BODY: usize = 25;
/// Bytes of MAC kept: 128 bits, so a forgery succeeds with chance 2^-128.
const MAC: usize = 16;
/// Bytes in a handle.
pub const LEN: usize = BODY + MAC;

/// The secret handles are signed with: one per store, kept in a file only
/// its owner can read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HandleKey([u8; 32]);

impl std::fmt::Debug for HandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandleKey(..)")
    }
}

impl HandleKey {
    /// A fresh key: handles signed with it die with the process.
    pub fn random() -> io::Result<HandleKey> {
        let mut key = [0; 32];
        getrandom::fill(&mut key).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
        Ok(HandleKey(key))
    }

    pub const fn from_bytes(key: [u8; 32]) -> HandleKey {
        HandleKey(key)
    }

    /// The key in the file at `path`, made (mode 0600) with a fresh key if
    /// there is none. A key file others can read, or of the wrong size, is
    /// refused with the reason.
    pub fn load_or_create(path: &Path) -> io::Result<HandleKey> {
        let fail = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", path.display()),
            )
        };
        if let Some(key) = create_key_file(path)? {
            return Ok(key);
        }
        let mut file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        if meta.mode() & 0o077 != 0 {
            return Err(fail(format!(
                "a handle key others can read (mode {:o}): chmod 600 it, or remove it to make a new one",
                meta.mode() & 0o7777
            )));
        }
        let mut key = [0; 32];
        let mut rest = Vec::new();
        file.read_exact(&mut key)
            .and_then(|()| file.read_to_end(&mut rest))
            .map_err(|e| fail(format!("not a handle key: {e}")))?;
        if !rest.is_empty() {
            return Err(fail("not a handle key: longer than 32 bytes".into()));
        }
        Ok(HandleKey(key))
    }

    fn mac(&self, body: &[u8]) -> [u8; MAC] {
        let hash = blake3::keyed_hash(&self.0, body);
        hash.as_bytes()[..MAC].try_into().expect("16 bytes")
    }
}

/// Makes the key file at `path` with a fresh key, whole or not at all: the
/// key is written and synced under a name of its own, then linked into
/// place. `None` when a key file is already there (another process may have
/// just made it: that one is used).
fn create_key_file(path: &Path) -> io::Result<Option<HandleKey>> {
    let at = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let dir = path.parent().unwrap_or(Path::new("."));
    let key = HandleKey::random()?;
    let unique = getrandom::u64().map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
    let staged = dir.join(format!(
        ".{}.{unique:016x}",
        path.file_name()
            .map_or("key".into(), |n| n.to_string_lossy())
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&staged)
        .map_err(at)?;
    let linked = file
        .write_all(&key.0)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::hard_link(&staged, path));
    let _ = std::fs::remove_file(&staged);
    match linked {
        Ok(()) => {
            std::fs::File::open(dir)?.sync_all()?;
            Ok(Some(key))
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(at(e)),
    }
}

thread_local! {
    /// The handle this thread last found signed, with the key it was.
    static LAST_SIGNED: std::cell::Cell<Option<(HandleKey, [u8; LEN])>> =
        const { std::cell::Cell::new(None) };
}

/// A handle from a call's arguments, decoded and its MAC checked once,
/// when the call was decoded: the file it names, or why it names none
/// (BADHANDLE, STALE).
pub type Checked = Result<FileHandle, Error>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHandle {
    pub export: u64,
    pub fileid: FileId,
    pub generation: u64,
}

impl FileHandle {
    pub const LEN: usize = LEN;

    pub fn bytes(&self, key: &HandleKey) -> [u8; LEN] {
        let mut out = [0; LEN];
        out[..BODY].copy_from_slice(&self.body());
        let mac = key.mac(&out[..BODY]);
        out[BODY..].copy_from_slice(&mac);
        out
    }

    /// What the MAC covers.
    fn body(&self) -> [u8; BODY] {
        let mut out = [0; BODY];
        out[0] = VERSION;
        out[1..9].copy_from_slice(&self.export.to_be_bytes());
        out[9..17].copy_from_slice(&self.fileid.to_be_bytes());
        out[17..25].copy_from_slice(&self.generation.to_be_bytes());
        out
    }

    /// The fields of a handle of the right shape, its MAC not checked: for
    /// routing a call, never for serving it.
    pub fn unchecked(bytes: &[u8]) -> Result<FileHandle, Error> {
        if bytes.len() != LEN || bytes[0] != VERSION {
            return Err(Error::BadHandle);
        }
        let word = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        Ok(FileHandle {
            export: word(1),
            fileid: word(9),
            generation: word(17),
        })
    }

    /// Whether `bytes` carry a MAC made with `key`. The same bytes under
    /// the same key always give the same answer, so the handle this thread
    /// found signed last is taken without signing again: consecutive calls
    /// on one file (a stream of WRITEs, LOOKUPs in one directory) compute
    /// one MAC. Both comparisons look at every byte (`constant_time_eq`):
    /// a guess is not told where it went wrong by an early exit.
    pub fn signed_with(bytes: &[u8], key: &HandleKey) -> bool {
        let Ok(bytes) = <&[u8; LEN]>::try_from(bytes) else {
            return false;
        };
        let last = LAST_SIGNED.get();
        if last.is_some_and(|(k, h)| k == *key && constant_time_eq(&h, bytes)) {
            return true;
        }
        let signed = constant_time_eq(&key.mac(&bytes[..BODY]), &bytes[BODY..]);
        if signed {
            LAST_SIGNED.set(Some((*key, *bytes)));
        }
        signed
    }

    /// Decodes a handle of export `export` signed with `key`: a malformed,
    /// changed or foreign handle is BADHANDLE, another export's is STALE.
    pub fn decode(bytes: &[u8], export: u64, key: &HandleKey) -> Result<FileHandle, Error> {
        let handle = FileHandle::unchecked(bytes)?;
        if !FileHandle::signed_with(bytes, key) {
            return Err(Error::BadHandle);
        }
        if handle.export != export {
            return Err(Error::Fs(layerfs_vfs::Error::Stale));
        }
        Ok(handle)
    }
}

/// Handles signed lately, so that listing a directory of thousands again
/// signs none of them: direct-mapped by file id, at most 4,096 handles
/// (about 40 bytes each, made at the first listing), and locked once per
/// listing.
#[derive(Default)]
pub struct SignedHandles(parking_lot::Mutex<Option<Signed>>);

/// Handles [`SignedHandles`] keeps.
const SIGNED_SLOTS: usize = 4096;

struct Signed {
    key: HandleKey,
    /// A slot is used when its body is the one asked for; an empty one
    /// (version 0) never is.
    slots: Box<[[u8; LEN]]>,
}

impl SignedHandles {
    /// Signs handles with `key`, from what is kept when it can; the slots
    /// of another key are emptied first. A listing that finds them in use by
    /// another signs without them rather than wait.
    pub fn signer(&self, key: &HandleKey) -> impl FnMut(&FileHandle) -> [u8; LEN] + '_ {
        let key = *key;
        let mut guard = self.0.try_lock();
        if let Some(kept) = guard.as_mut() {
            if kept.as_ref().is_none_or(|s| s.key != key) {
                **kept = Some(Signed {
                    key,
                    slots: vec![[0; LEN]; SIGNED_SLOTS].into_boxed_slice(),
                });
            }
        }
        move |handle| {
            let Some(signed) = guard.as_mut().and_then(|kept| kept.as_mut()) else {
                return handle.bytes(&key);
            };
            let body = handle.body();
            let slot = &mut signed.slots[handle.fileid as usize % SIGNED_SLOTS];
            if slot[..BODY] != body {
                *slot = handle.bytes(&signed.key);
            }
            *slot
        }
    }
}

/// Compares with `subtle`, which looks at every byte whatever it finds
/// and keeps the compiler from cutting that short, so the comparison does
/// not stop at the first byte a forged MAC got wrong.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: FileHandle = FileHandle {
        export: 7,
        fileid: 42,
        generation: 99,
    };

    #[test]
    fn kept_handles_are_the_ones_signing_would_make() {
        let signed = SignedHandles::default();
        let (a, b) = (
            HandleKey::from_bytes([1; 32]),
            HandleKey::from_bytes([2; 32]),
        );
        // Ids that share slots, generations that differ, each asked twice.
        let handles: Vec<FileHandle> = (0..3u64)
            .flat_map(|i| [42 + i * SIGNED_SLOTS as u64, 43])
            .flat_map(|fileid| {
                [1, 2].map(|generation| FileHandle {
                    export: 7,
                    fileid,
                    generation,
                })
            })
            .collect();
        for key in [a, b, a] {
            let mut sign = signed.signer(&key);
            // A second listing at the same time signs without the slots.
            let mut meanwhile = signed.signer(&b);
            for h in handles.iter().chain(&handles) {
                assert_eq!(sign(h), h.bytes(&key), "{h:?}");
                assert_eq!(FileHandle::decode(&sign(h), 7, &key).unwrap(), *h);
                assert_eq!(meanwhile(h), h.bytes(&b), "{h:?}");
            }
        }
    }

    #[test]
    fn a_handle_round_trips_and_fits_nfsv3() {
        let key = HandleKey::random().unwrap();
        let bytes = H.bytes(&key);
        assert!(bytes.len() <= 64);
        assert_eq!(FileHandle::decode(&bytes, 7, &key), Ok(H));
    }

    #[test]
    fn malformed_forged_and_foreign_handles_are_refused() {
        let key = HandleKey::from_bytes([1; 32]);
        let bytes = H.bytes(&key);
        assert_eq!(
            FileHandle::decode(&bytes[..LEN - 1], 7, &key),
            Err(Error::BadHandle)
        );
        assert_eq!(FileHandle::decode(&[], 7, &key), Err(Error::BadHandle));
        let mut wrong_version = bytes;
        wrong_version[0] = 1;
        assert_eq!(
            FileHandle::decode(&wrong_version, 7, &key),
            Err(Error::BadHandle)
        );
        // Any one bit changed anywhere: the MAC no longer holds.
        for at in 1..LEN {
            let mut forged = bytes;
            forged[at] ^= 1;
            assert_eq!(
                FileHandle::decode(&forged, 7, &key),
                Err(Error::BadHandle),
                "byte {at}"
            );
        }
        // Another store's key.
        let other = HandleKey::from_bytes([2; 32]);
        assert_eq!(
            FileHandle::decode(&H.bytes(&other), 7, &key),
            Err(Error::BadHandle)
        );
        // Ours, but of another export.
        assert_eq!(
            FileHandle::decode(&bytes, 8, &key),
            Err(Error::Fs(layerfs_vfs::Error::Stale))
        );
    }

    #[test]
    fn the_handle_found_signed_last_vouches_for_those_bytes_and_that_key_alone() {
        let key = HandleKey::from_bytes([3; 32]);
        let other = HandleKey::from_bytes([4; 32]);
        let bytes = H.bytes(&key);
        assert_eq!(FileHandle::decode(&bytes, 7, &key), Ok(H));
        // Right after it: the same handle again, and nothing else.
        assert_eq!(FileHandle::decode(&bytes, 7, &key), Ok(H));
        for at in 0..LEN {
            let mut forged = bytes;
            forged[at] ^= 0x80;
            assert!(!FileHandle::signed_with(&forged, &key), "byte {at}");
            assert_eq!(FileHandle::decode(&bytes, 7, &key), Ok(H));
        }
        assert!(!FileHandle::signed_with(&bytes, &other));
        assert!(!FileHandle::signed_with(&bytes[..LEN - 1], &key));
        // Another thread has not seen it and signs it afresh.
        let on_another = std::thread::spawn(move || FileHandle::signed_with(&bytes, &other));
        assert!(!on_another.join().unwrap());
    }

    #[test]
    fn processes_making_the_key_at_once_all_get_the_one_made() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handle.key");
        let keys: Vec<HandleKey> = std::thread::scope(|s| {
            let makers: Vec<_> = (0..8)
                .map(|_| s.spawn(|| HandleKey::load_or_create(&path).unwrap()))
                .collect();
            makers.into_iter().map(|m| m.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]));
        // Nothing staged is left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_key_file_is_made_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handle.key");
        let key = HandleKey::load_or_create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(HandleKey::load_or_create(&path).unwrap(), key);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = HandleKey::load_or_create(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::write(dir.path().join("short"), b"abc").unwrap();
        std::fs::set_permissions(
            dir.path().join("short"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let e = HandleKey::load_or_create(&dir.path().join("short")).unwrap_err();
        assert!(e.to_string().contains("not a handle key"), "{e}");
    }
}
