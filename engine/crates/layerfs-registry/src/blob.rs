//! A layer of the store as an OCI layer blob: a gzip-compressed tar, or one
//! with a table of contents that a lazy pull reads (eStargz, zstd:chunked).
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
mod toc;
mod zstd_chunked;

pub use estargz::TOC_DIGEST;
pub use zstd_chunked::MANIFEST_CHECKSUM;
pub(crate) use zstd_chunked::PREFIXES as ZSTD_CHUNKED_PREFIXES;

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
    /// A zstd tar that a lazy pull reads in parts: zstd:chunked.
    ZstdChunked,
}

impl BlobFormat {
    /// Whether `blob` is of this format: a lazy format's blob carries its
    /// table's annotation; for gzip, any blob but an eStargz or a zstd one
    /// (which tools older than zstd in OCI cannot read) does: an
    /// uncompressed one is taken as it is.
    pub fn is_of(self, blob: &BlobInfo) -> bool {
        let noted = |key: &str| blob.annotations.iter().any(|(k, _)| k == key);
        let estargz = blob.media_type == LAYER_GZIP && noted(TOC_DIGEST);
        match self {
            BlobFormat::Estargz => estargz,
            BlobFormat::ZstdChunked => blob.media_type == LAYER_ZSTD && noted(MANIFEST_CHECKSUM),
            BlobFormat::Gzip => !estargz && blob.media_type != LAYER_ZSTD,
        }
    }
}

impl std::str::FromStr for BlobFormat {
    type Err = crate::Error;

    fn from_str(name: &str) -> Result<BlobFormat, crate::Error> {
        match name {
            "gzip" => Ok(BlobFormat::Gzip),
            "estargz" => Ok(BlobFormat::Estargz),
            "zstd:chunked" => Ok(BlobFormat::ZstdChunked),
            other => Err(crate::Error::new(
                crate::ErrorKind::Invalid,
                format!("{other:?}: a layer format is gzip, estargz or zstd:chunked"),
            )),
        }
    }
}

/// The media types of the blobs written here.
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// Writes the layer at `dir` as a compressed tar to `out`, in `format`.
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
            let (sink, mut toc) = toc::Toc::new(file, toc::Layout::Estargz);
            let mut tar = new_tar(sink);
            estargz::no_prefetch_landmark(&mut tar, &mut toc)?;
            Walk::new(&mut tar, Some(&mut toc)).dir(dir, Path::new(""))?;
            let done = estargz::finish(toc, tar)?;
            (done.out, done.diff_id, done.annotations)
        }
        BlobFormat::ZstdChunked => {
            let (sink, mut toc) = toc::Toc::new(file, toc::Layout::ZstdChunked);
            let mut tar = new_tar(sink);
            Walk::new(&mut tar, Some(&mut toc)).dir(dir, Path::new(""))?;
            let done = zstd_chunked::finish(toc, tar)?;
            (done.out, done.diff_id, done.annotations)
        }
    };
    let media_type = match format {
        BlobFormat::Gzip | BlobFormat::Estargz => LAYER_GZIP,
        BlobFormat::ZstdChunked => LAYER_ZSTD,
    };
    file.inner.flush()?;
    file.inner.get_ref().sync_all()?;
    Ok(BlobInfo {
        digest: file.digest(),
        size: file.count,
        media_type: media_type.to_owned(),
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
    /// The table of contents a lazy format's entries go into.
    toc: Option<&'t mut toc::Toc>,
}

impl<'t, W: Write> Walk<'t, W> {
    fn new(tar: &'t mut tar::Builder<W>, toc: Option<&'t mut toc::Toc>) -> Self {
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
            let toc_meta = toc::Meta::of(&meta);
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

#[cfg(test)]
mod tests {
    use std::io::Read;

    use oci_client::manifest::OciDescriptor;

    use super::*;
    use crate::decompress::Compression;
    use crate::lazy::toc::{entries, estargz_toc_offset, zstd_chunked_toc_json, Format};
    use layerfs_layers::lazy::EntryKind;

    /// A layer of files of every size that matters: empty, small, one
    /// chunk exactly, several chunks; a link, a second name, a directory.
    fn layer() -> (tempfile::TempDir, Vec<(&'static str, Vec<u8>)>) {
        let dir = tempfile::tempdir().unwrap();
        let bytes = |n: usize, seed: u8| -> Vec<u8> {
            (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
        };
        let files = vec![
            ("a/empty", Vec::new()),
            ("a/small", b"hello".to_vec()),
            ("a/chunk", bytes(toc::CHUNK as usize, 1)),
            ("b/big", bytes(2 * toc::CHUNK as usize + 1000, 2)),
            ("b/tail", bytes(513, 3)),
        ];
        for (path, content) in &files {
            let path = dir.path().join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }
        std::os::unix::fs::symlink("small", dir.path().join("a/link")).unwrap();
        fs::hard_link(dir.path().join("a/small"), dir.path().join("b/again")).unwrap();
        (dir, files)
    }

    /// Writes the layer in `format`, then reads it as a lazy pull does
    /// (the table found through the annotations, each file's pieces
    /// decoded from their ranges alone) and as a full pull does (the whole
    /// stream), checking both against the files.
    fn round_trip(format: BlobFormat) {
        let (dir, files) = layer();
        let out = tempfile::tempdir().unwrap();
        let path = out.path().join("blob");
        let info = write_layer_blob(dir.path(), &path, format).unwrap();
        let blob = fs::read(&path).unwrap();
        assert_eq!(info.size, blob.len() as u64);
        assert!(format.is_of(&info), "{format:?} knows its own blob");

        let descriptor = OciDescriptor {
            media_type: info.media_type.clone(),
            digest: info.digest.clone(),
            size: info.size as i64,
            annotations: Some(info.annotations.iter().cloned().collect()),
            ..Default::default()
        };
        let lazy = Format::of(&descriptor).unwrap().expect("a lazy format");
        if format == BlobFormat::ZstdChunked {
            // Under both prefixes, alike: podman 4 reads only the older.
            let notes: std::collections::HashMap<_, _> = info.annotations.iter().cloned().collect();
            for name in ["manifest-checksum", "manifest-position"] {
                let [current, older] =
                    ZSTD_CHUNKED_PREFIXES.map(|p| notes.get(&format!("{p}{name}")));
                assert!(
                    current.is_some() && current == older,
                    "{name}: {current:?} {older:?}"
                );
            }
        }
        let (json, toc_at) = match &lazy {
            Format::Estargz { toc_digest } => {
                let at = estargz_toc_offset(&blob[blob.len() - 51..]).unwrap();
                let end = blob.len() - 51;
                let member = &blob[at as usize..end];
                let json = crate::lazy::toc::estargz_toc_json(member, toc_digest).unwrap();
                (json, at)
            }
            Format::ZstdChunked {
                offset,
                length,
                checksum,
            } => {
                let table = &blob[*offset as usize..(offset + length) as usize];
                (zstd_chunked_toc_json(table, checksum).unwrap(), *offset)
            }
        };
        let tree = entries(&json, &lazy, info.size, toc_at).unwrap();
        let compression = Compression::of(&info.media_type).unwrap();
        for (name, content) in &files {
            let entry = tree
                .iter()
                .find(|e| e.path == Path::new(name))
                .unwrap_or_else(|| panic!("{name} is in the table"));
            let EntryKind::File { size, pieces, .. } = &entry.kind else {
                panic!("{name} is a file");
            };
            assert_eq!(*size, content.len() as u64, "{name}");
            let mut read = vec![0u8; content.len()];
            for piece in pieces {
                let range = &blob[piece.start as usize..piece.end as usize];
                let data = compression.piece(range, piece).unwrap();
                assert_eq!(data.len() as u64, piece.len, "{name} at {}", piece.at);
                if format == BlobFormat::ZstdChunked {
                    // Its frames hold its data and nothing else.
                    let mut all = Vec::new();
                    compression.decoder(range).read_to_end(&mut all).unwrap();
                    assert_eq!(all.len() as u64, piece.len, "{name}'s frames alone");
                }
                read[piece.at as usize..][..data.len()].copy_from_slice(&data);
            }
            assert!(&read == content, "{name} read from its pieces");
        }

        // The whole stream is a tar of the same files, hashed as its diff_id.
        let mut tar_bytes = Vec::new();
        compression
            .decoder(&blob[..])
            .read_to_end(&mut tar_bytes)
            .unwrap();
        let digest = format!("sha256:{}", crate::hex(&Sha256::digest(&tar_bytes)));
        assert_eq!(digest, info.diff_id);
        let mut archive = tar::Archive::new(&tar_bytes[..]);
        let mut seen = 0;
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            if let Some((_, content)) = files.iter().find(|(n, _)| *n == name) {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).unwrap();
                assert!(&data == content, "{name} in the tar");
                seen += 1;
            }
        }
        assert_eq!(seen, files.len());
    }

    #[test]
    fn an_estargz_blob_reads_back_whole_and_in_pieces() {
        round_trip(BlobFormat::Estargz);
    }

    #[test]
    fn a_zstd_chunked_blob_reads_back_whole_and_in_pieces() {
        round_trip(BlobFormat::ZstdChunked);
    }

    #[test]
    fn a_gzip_push_takes_no_blob_an_older_tool_cannot_read() {
        let blob = |media_type: &str, note: Option<&str>| BlobInfo {
            digest: String::new(),
            size: 0,
            media_type: media_type.into(),
            diff_id: String::new(),
            repository: None,
            annotations: note
                .map(|n| (n.to_owned(), "x".to_owned()))
                .into_iter()
                .collect(),
        };
        assert!(BlobFormat::Gzip.is_of(&blob(LAYER_GZIP, None)));
        assert!(BlobFormat::Gzip.is_of(&blob("application/vnd.oci.image.layer.v1.tar", None)));
        assert!(!BlobFormat::Gzip.is_of(&blob(LAYER_GZIP, Some(TOC_DIGEST))));
        assert!(!BlobFormat::Gzip.is_of(&blob(LAYER_ZSTD, None)));
        assert!(!BlobFormat::Gzip.is_of(&blob(LAYER_ZSTD, Some(MANIFEST_CHECKSUM))));
        assert!(BlobFormat::ZstdChunked.is_of(&blob(LAYER_ZSTD, Some(MANIFEST_CHECKSUM))));
        assert!(!BlobFormat::ZstdChunked.is_of(&blob(LAYER_ZSTD, None)));
    }

    #[test]
    fn a_format_is_named_as_the_command_line_names_it() {
        assert_eq!("zstd:chunked".parse().ok(), Some(BlobFormat::ZstdChunked));
        assert_eq!("estargz".parse().ok(), Some(BlobFormat::Estargz));
        let refused = "zstd".parse::<BlobFormat>().unwrap_err();
        assert_eq!(refused.kind, crate::ErrorKind::Invalid);
    }
}
