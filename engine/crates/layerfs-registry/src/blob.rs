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

mod estargz;

pub use estargz::TOC_DIGEST;

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
    /// The descriptor's annotations (an eStargz blob's table digest).
    #[serde(default)]
    pub annotations: Vec<(String, String)>,
}

/// How a layer is written as a blob.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlobFormat {
    /// A gzip tar, one member.
    #[default]
    Gzip,
    /// A gzip tar that a lazy pull reads in parts: eStargz.
    Estargz,
}

impl BlobFormat {
    /// Whether `blob` is of this format.
    pub fn is_of(self, blob: &BlobInfo) -> bool {
        let lazy = blob.annotations.iter().any(|(k, _)| k == TOC_DIGEST);
        blob.media_type == LAYER_GZIP && lazy == (self == BlobFormat::Estargz)
            || self == BlobFormat::Gzip && blob.media_type != LAYER_GZIP
    }
}

/// The media type of the blobs written here.
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Writes the layer at `dir` as a gzip-compressed tar to `out`, in
/// `format`.
pub fn write_layer_blob(dir: &Path, out: &Path, format: BlobFormat) -> io::Result<BlobInfo> {
    let file = Hashing::new(BufWriter::with_capacity(1 << 20, File::create(out)?));
    let (mut file, diff_id, annotations) = match format {
        BlobFormat::Gzip => {
            let gzip = flate2::GzBuilder::new().write(file, flate2::Compression::fast());
            let mut tar = new_tar(Hashing::new(gzip));
            Walk::new(&mut tar, None).dir(dir, Path::new(""))?;
            tar.finish()?;
            let tarred = tar.into_inner()?;
            let diff_id = tarred.digest();
            (tarred.inner.finish()?, diff_id, Vec::new())
        }
        BlobFormat::Estargz => {
            let (sink, mut toc) = estargz::Toc::new(file);
            let mut tar = new_tar(sink);
            estargz::no_prefetch_landmark(&mut tar, &mut toc)?;
            Walk::new(&mut tar, Some(&mut toc)).dir(dir, Path::new(""))?;
            let done = toc.finish(tar)?;
            (done.out, done.diff_id, done.annotations)
        }
    };
    file.inner.flush()?;
    file.inner.get_ref().sync_all()?;
    Ok(BlobInfo {
        digest: file.digest(),
        size: file.count,
        media_type: LAYER_GZIP.to_owned(),
        diff_id,
        repository: None,
        annotations,
    })
}

fn new_tar<W: Write>(sink: W) -> tar::Builder<W> {
    let mut tar = tar::Builder::new(sink);
    tar.mode(tar::HeaderMode::Complete);
    tar.follow_symlinks(false);
    tar
}

struct Walk<'t, W: Write> {
    tar: &'t mut tar::Builder<W>,
    /// The first path of each file with several names.
    links: HashMap<(u64, u64), PathBuf>,
    /// The table of contents an eStargz blob's entries go into.
    toc: Option<&'t mut estargz::Toc>,
}

impl<'t, W: Write> Walk<'t, W> {
    fn new(tar: &'t mut tar::Builder<W>, toc: Option<&'t mut estargz::Toc>) -> Self {
        Walk {
            tar,
            links: HashMap::new(),
            toc,
        }
    }

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
            let name = to.to_string_lossy();
            let toc_meta = estargz::Meta::of(&meta);
            if !meta.is_dir() && meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = self.links.get(&key) {
                    header.set_entry_type(tar::EntryType::Link);
                    header.set_size(0);
                    self.tar.append_link(&mut header, &to, first)?;
                    if let Some(toc) = self.toc.as_deref_mut() {
                        let first = first.to_string_lossy();
                        toc.entry::<io::Empty>(
                            &name,
                            "hardlink",
                            &toc_meta,
                            Some(&first),
                            &[],
                            None,
                        );
                    }
                    continue;
                }
                self.links.insert(key, to.clone());
            }
            let xattrs = self.pax(&path, &meta)?;
            let kind = meta.file_type();
            if meta.is_dir() {
                self.tar.append_data(&mut header, &to, io::empty())?;
                if let Some(toc) = self.toc.as_deref_mut() {
                    toc.entry::<io::Empty>(&name, "dir", &toc_meta, None, &xattrs, None);
                }
                self.dir(&path, &to)?;
            } else if kind.is_symlink() {
                let target = fs::read_link(&path)?;
                self.tar.append_link(&mut header, &to, &target)?;
                if let Some(toc) = self.toc.as_deref_mut() {
                    let target = target.to_string_lossy();
                    toc.entry::<io::Empty>(&name, "symlink", &toc_meta, Some(&target), &[], None);
                }
            } else if meta.is_file() {
                match self.toc.as_deref_mut() {
                    None => self.tar.append_data(&mut header, &to, File::open(&path)?)?,
                    Some(toc) => {
                        let mut data = toc.reader(File::open(&path)?);
                        self.tar.append_data(&mut header, &to, &mut data)?;
                        toc.entry(&name, "reg", &toc_meta, None, &xattrs, Some(data));
                    }
                }
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
                if let Some(toc) = self.toc.as_deref_mut() {
                    let kind = match () {
                        _ if kind.is_char_device() => "char",
                        _ if kind.is_block_device() => "block",
                        _ => "fifo",
                    };
                    toc.entry::<io::Empty>(&name, kind, &toc_meta, None, &xattrs, None);
                }
            }
        }
        Ok(())
    }

    /// What a tar header cannot hold, as one PAX record before the entry:
    /// extended attributes, and a time finer than a second.
    /// Returns the extended attributes.
    fn pax(&mut self, path: &Path, meta: &fs::Metadata) -> io::Result<Vec<(String, Vec<u8>)>> {
        let mut records: Vec<(String, Vec<u8>)> = Vec::new();
        let mut xattrs = Vec::new();
        if !meta.file_type().is_symlink() {
            for (name, value) in layerfs_layers::kept_xattrs(path)? {
                let name = name.to_string_lossy().into_owned();
                records.push((format!("SCHILY.xattr.{name}"), value.clone()));
                xattrs.push((name, value));
            }
        }
        if meta.mtime_nsec() != 0 {
            let mtime = format!("{}.{:09}", meta.mtime(), meta.mtime_nsec());
            records.push(("mtime".to_owned(), mtime.into_bytes()));
        }
        if !records.is_empty() {
            self.tar
                .append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
        }
        Ok(xattrs)
    }
}

/// A writer that hashes and counts what goes through it.
pub(crate) struct Hashing<W> {
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
