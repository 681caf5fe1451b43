//! A layer of the store as an OCI layer blob: a gzip-compressed tar.
//!
//! The layer's own files are the OCI form already (`.wh.NAME` whiteouts,
//! `.wh..wh..opq` opaque markers), so they are written as they are. Hard
//! links are written as links, extended attributes as PAX `SCHILY.xattr.`
//! records, times to the nanosecond as PAX `mtime`. The walk is sorted and
//! the gzip header carries no time, so the same layer always gives the
//! same bytes, and its digest can be remembered and checked.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// What a blob is: its digest, its size, the digest of the tar in it, and
/// where it is known to be.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlobInfo {
    pub digest: String,
    pub size: u64,
    pub media_type: String,
    pub diff_id: String,
    /// `registry/repository` it was pulled from or pushed to: a push to
    /// another repository of that registry mounts it from there.
    #[serde(default)]
    pub repository: Option<String>,
}

/// The media type of the blobs written here.
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Writes the layer at `dir` as a gzip-compressed tar to `out`.
pub fn write_layer_blob(dir: &Path, out: &Path) -> io::Result<BlobInfo> {
    let file = Hashing::new(BufWriter::with_capacity(1 << 20, File::create(out)?));
    let gzip = flate2::GzBuilder::new().write(file, flate2::Compression::fast());
    let mut tar = tar::Builder::new(Hashing::new(gzip));
    tar.mode(tar::HeaderMode::Complete);
    tar.follow_symlinks(false);
    let mut walk = Walk {
        tar: &mut tar,
        links: HashMap::new(),
    };
    walk.dir(dir, Path::new(""))?;
    tar.finish()?;
    let tarred = tar.into_inner()?;
    let diff_id = tarred.digest();
    let mut file = tarred.inner.finish()?;
    file.inner.flush()?;
    file.inner.get_ref().sync_all()?;
    Ok(BlobInfo {
        digest: file.digest(),
        size: file.count,
        media_type: LAYER_GZIP.to_owned(),
        diff_id,
        repository: None,
    })
}

struct Walk<'t, W: Write> {
    tar: &'t mut tar::Builder<W>,
    /// The first path of each file with several names.
    links: HashMap<(u64, u64), PathBuf>,
}

impl<W: Write> Walk<'_, W> {
    fn dir(&mut self, dir: &Path, rel: &Path) -> io::Result<()> {
        let mut names: Vec<_> = fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in names {
            let path = dir.join(&name);
            let to = rel.join(&name);
            let meta = fs::symlink_metadata(&path)?;
            let mut header = tar::Header::new_gnu();
            header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
            if !meta.is_dir() && meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = self.links.get(&key) {
                    header.set_entry_type(tar::EntryType::Link);
                    header.set_size(0);
                    self.tar.append_link(&mut header, &to, first)?;
                    continue;
                }
                self.links.insert(key, to.clone());
            }
            self.pax(&path, &meta)?;
            if meta.is_dir() {
                self.tar.append_data(&mut header, &to, io::empty())?;
                self.dir(&path, &to)?;
            } else if meta.file_type().is_symlink() {
                let target = fs::read_link(&path)?;
                self.tar.append_link(&mut header, &to, target)?;
            } else if meta.is_file() {
                self.tar.append_data(&mut header, &to, File::open(&path)?)?;
            } else {
                // FIFOs and devices: their header says all, a device's
                // numbers included (tar's metadata leaves them 0,0, which
                // podman reads as a whiteout).
                use std::os::unix::fs::FileTypeExt;
                let kind = meta.file_type();
                if kind.is_char_device() || kind.is_block_device() {
                    let rdev = meta.rdev() as _;
                    header.set_device_major(rustix::fs::major(rdev))?;
                    header.set_device_minor(rustix::fs::minor(rdev))?;
                }
                header.set_size(0);
                self.tar.append_data(&mut header, &to, io::empty())?;
            }
        }
        Ok(())
    }

    /// What a tar header cannot hold, as one PAX record before the entry:
    /// extended attributes, and a time finer than a second.
    fn pax(&mut self, path: &Path, meta: &fs::Metadata) -> io::Result<()> {
        let mut records: Vec<(String, Vec<u8>)> = Vec::new();
        if !meta.file_type().is_symlink() {
            for (name, value) in layerfs_layers::kept_xattrs(path)? {
                records.push((format!("SCHILY.xattr.{}", name.to_string_lossy()), value));
            }
        }
        if meta.mtime_nsec() != 0 {
            let mtime = format!("{}.{:09}", meta.mtime(), meta.mtime_nsec());
            records.push(("mtime".to_owned(), mtime.into_bytes()));
        }
        if records.is_empty() {
            return Ok(());
        }
        self.tar
            .append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
    }
}

/// A writer that hashes and counts what goes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    count: u64,
}

impl<W> Hashing<W> {
    fn new(inner: W) -> Hashing<W> {
        Hashing {
            inner,
            hash: Sha256::new(),
            count: 0,
        }
    }

    fn digest(&self) -> String {
        format!("sha256:{}", crate::hex(&self.hash.clone().finalize()))
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
