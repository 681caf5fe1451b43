//! The content digest that names a layer.
//!
//! SHA-256 over a canonical walk of the tree: entries in byte order of their
//! paths, each with its type, permission bits, owner, and either its
//! content's digest, its symlink target or nothing. Times are left out, so the
//! same files imported from a directory or from a tarball get the same id.

use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use sha2::{Digest, Sha256};

/// The hex SHA-256 digest of the tree under `root` (not following symlinks).
pub fn tree_digest(root: &Path) -> io::Result<String> {
    let mut hash = Sha256::new();
    walk(root, b"", &mut hash)?;
    Ok(hex(&hash.finalize()))
}

fn walk(dir: &Path, rel: &[u8], hash: &mut Sha256) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        let path = dir.join(&name);
        let meta = fs::symlink_metadata(&path)?;
        let mut entry_rel = rel.to_vec();
        entry_rel.push(b'/');
        entry_rel.extend_from_slice(name.as_bytes());
        let kind = meta.file_type();
        let tag: &[u8] = if kind.is_dir() {
            b"d"
        } else if kind.is_symlink() {
            b"l"
        } else if kind.is_file() {
            b"f"
        } else if kind.is_fifo() {
            b"p"
        } else if kind.is_char_device() {
            b"c"
        } else if kind.is_block_device() {
            b"b"
        } else {
            b"s"
        };
        // Lengths first, so no two different trees serialise the same.
        hash.update((entry_rel.len() as u64).to_be_bytes());
        hash.update(&entry_rel);
        hash.update(tag);
        hash.update((meta.mode() & 0o7777).to_be_bytes());
        hash.update(meta.uid().to_be_bytes());
        hash.update(meta.gid().to_be_bytes());
        if kind.is_file() {
            hash.update(file_digest(&path)?);
        } else if kind.is_symlink() {
            let target = fs::read_link(&path)?;
            hash.update((target.as_os_str().len() as u64).to_be_bytes());
            hash.update(target.as_os_str().as_bytes());
        } else if kind.is_char_device() || kind.is_block_device() {
            hash.update(meta.rdev().to_be_bytes());
        }
        if kind.is_dir() {
            walk(&path, &entry_rel, hash)?;
            hash.update(b"end");
        }
    }
    Ok(())
}

fn file_digest(path: &Path) -> io::Result<[u8; 32]> {
    let mut file = fs::File::open(path)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0; 256 * 1024];
    loop {
        match file.read(&mut buf)? {
            0 => return Ok(hash.finalize().into()),
            n => hash.update(&buf[..n]),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
