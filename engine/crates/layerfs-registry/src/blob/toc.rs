//! A layer as an eStargz blob (containerd/stargz-snapshotter
//! `docs/estargz.md`): a gzip tar any tool unpacks, whose every regular
//! file's data, [`CHUNK`] bytes at a time, begins a gzip member of its own;
//! then the table of contents (`stargz.index.json`, the last tar entry, in a
//! member of its own with the archive's end blocks) and the 51-byte footer
//! that points to it. A lazy pull reads the table and then only the members
//! it needs.
//!
//! The tar is written by the same walk as a plain blob ([`super::Walk`]);
//! only the sink differs: it starts a new member when a file's data is
//! about to be written, which the file's reader announces as it is first
//! read (the tar writer reads data only once its header is out).

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::rc::Rc;

use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Hashing;

/// The most data of one file in one member: a read fetches at most this
/// much more than it needs.
pub(crate) const CHUNK: u64 = 4 << 20;

/// The annotation that pins the table of contents.
pub const TOC_DIGEST: &str = "containerd.io/snapshot/stargz/toc.digest";
const UNCOMPRESSED_SIZE: &str = "io.containers.estargz.uncompressed-size";

/// What the sink and the readers of files' data share: whether a member
/// is to begin before the next byte, and where each member began.
#[derive(Default)]
struct Cuts {
    pending: bool,
    starts: Vec<u64>,
}

/// The sink of the tar stream: gzip members one after another into `out`,
/// the uncompressed bytes hashed (the `diff_id`).
pub(super) struct Members<W: Write> {
    encoder: Option<flate2::write::GzEncoder<Hashing<W>>>,
    raw: Sha256,
    raw_len: u64,
    cuts: Rc<RefCell<Cuts>>,
}

impl<W: Write> Members<W> {
    fn new(out: Hashing<W>) -> Self {
        Members {
            encoder: Some(member(out)),
            raw: Sha256::new(),
            raw_len: 0,
            cuts: Rc::default(),
        }
    }

    /// Ends the member under way and begins another; returns where it begins.
    fn cut(&mut self) -> io::Result<u64> {
        let out = self.encoder.take().expect("a member is open").finish()?;
        let at = out.count;
        self.encoder = Some(member(out));
        Ok(at)
    }

    /// Ends the last member; the compressed stream, and the `diff_id`.
    fn finish(mut self) -> io::Result<(Hashing<W>, String, u64)> {
        let out = self.encoder.take().expect("a member is open").finish()?;
        let diff_id = format!("sha256:{}", crate::hex(&self.raw.finalize()));
        Ok((out, diff_id, self.raw_len))
    }
}

fn member<W: Write>(out: Hashing<W>) -> flate2::write::GzEncoder<Hashing<W>> {
    flate2::GzBuilder::new().write(out, flate2::Compression::fast())
}

impl<W: Write> Write for Members<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if std::mem::take(&mut self.cuts.borrow_mut().pending) {
            let at = self.cut()?;
            self.cuts.borrow_mut().starts.push(at);
        }
        let n = self
            .encoder
            .as_mut()
            .expect("a member is open")
            .write(buf)?;
        self.raw.update(&buf[..n]);
        self.raw_len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.encoder.as_mut().expect("a member is open").flush()
    }
}

/// A regular file's data as the tar writer reads it: a member is announced
/// before each chunk's first byte; the file's and each chunk's digests are
/// taken on the way.
pub(super) struct ChunkedFile<R> {
    file: R,
    at: u64,
    cuts: Rc<RefCell<Cuts>>,
    whole: Sha256,
    chunk: Sha256,
    chunks: Vec<String>,
}

impl<R: Read> Read for ChunkedFile<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = (CHUNK - self.at % CHUNK).min(buf.len() as u64) as usize;
        let n = self.file.read(&mut buf[..room])?;
        if n == 0 {
            return Ok(0);
        }
        if self.at.is_multiple_of(CHUNK) {
            self.cuts.borrow_mut().pending = true;
        }
        self.whole.update(&buf[..n]);
        self.chunk.update(&buf[..n]);
        self.at += n as u64;
        if self.at.is_multiple_of(CHUNK) {
            self.end_chunk();
        }
        Ok(n)
    }
}

impl<R> ChunkedFile<R> {
    fn end_chunk(&mut self) {
        let digest = std::mem::take(&mut self.chunk).finalize();
        self.chunks.push(format!("sha256:{}", crate::hex(&digest)));
    }
}

/// A written eStargz blob: its descriptor's annotations, its compressed
/// stream, and its `diff_id`.
pub(super) struct Finished<W> {
    pub annotations: Vec<(String, String)>,
    pub out: Hashing<W>,
    pub diff_id: String,
}

/// The eStargz side of a layer's walk: the table's entries as they come.
pub(super) struct Toc {
    cuts: Rc<RefCell<Cuts>>,
    entries: Vec<Value>,
}

/// What the table says of an entry besides its name and type.
pub(super) struct Meta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, u32),
    pub rdev: u64,
}

impl Meta {
    pub(super) fn of(meta: &std::fs::Metadata) -> Meta {
        use std::os::unix::fs::MetadataExt;
        Meta {
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            mtime: (meta.mtime(), meta.mtime_nsec() as u32),
            rdev: meta.rdev(),
        }
    }
}

impl Toc {
    /// The sink for a walk's tar, and the table it fills: the table begins
    /// with the landmark that says no file is to be prefetched.
    pub(super) fn new<W: Write>(out: Hashing<W>) -> (Members<W>, Toc) {
        let sink = Members::new(out);
        let toc = Toc {
            cuts: sink.cuts.clone(),
            entries: Vec::new(),
        };
        (sink, toc)
    }

    /// The reader of a regular file's data for the tar writer.
    pub(super) fn reader<R: Read>(&self, file: R) -> ChunkedFile<R> {
        ChunkedFile {
            file,
            at: 0,
            cuts: self.cuts.clone(),
            whole: Sha256::new(),
            chunk: Sha256::new(),
            chunks: Vec::new(),
        }
    }

    /// Notes an entry: `name` as in the tar, of `kind` (`dir`, `reg`,
    /// `symlink`, `hardlink`, `char`, `block`, `fifo`), with `meta` and,
    /// for a regular file, what its reader saw.
    pub(super) fn entry<R>(
        &mut self,
        name: &str,
        kind: &str,
        meta: &Meta,
        link: Option<&str>,
        xattrs: &[(String, Vec<u8>)],
        data: Option<ChunkedFile<R>>,
    ) {
        let mut entry = json!({
            "name": name,
            "type": kind,
            "mode": meta.mode,
            "uid": meta.uid,
            "gid": meta.gid,
            "modtime": chrono::DateTime::from_timestamp(meta.mtime.0, meta.mtime.1)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
        });
        if let Some(link) = link {
            entry["linkName"] = json!(link);
        }
        if kind == "char" || kind == "block" {
            let rdev = meta.rdev as _;
            entry["devMajor"] = json!(rustix::fs::major(rdev));
            entry["devMinor"] = json!(rustix::fs::minor(rdev));
        }
        if !xattrs.is_empty() {
            let encoded: serde_json::Map<String, Value> = xattrs
                .iter()
                .map(|(n, v)| {
                    (
                        n.clone(),
                        json!(base64::engine::general_purpose::STANDARD.encode(v)),
                    )
                })
                .collect();
            entry["xattrs"] = Value::Object(encoded);
        }
        let Some(mut data) = data else {
            self.entries.push(entry);
            return;
        };
        if !data.at.is_multiple_of(CHUNK) {
            data.end_chunk();
        }
        let size = data.at;
        entry["size"] = json!(size);
        entry["digest"] = json!(format!("sha256:{}", crate::hex(&data.whole.finalize())));
        let starts = std::mem::take(&mut self.cuts.borrow_mut().starts);
        let chunk_size = |i: usize| if i + 1 == data.chunks.len() { 0 } else { CHUNK };
        for (i, (start, digest)) in starts.iter().zip(&data.chunks).enumerate() {
            if i == 0 {
                entry["offset"] = json!(start);
                entry["chunkSize"] = json!(chunk_size(i));
                entry["chunkDigest"] = json!(digest);
                self.entries.push(entry.clone());
            } else {
                self.entries.push(json!({
                    "name": name,
                    "type": "chunk",
                    "offset": start,
                    "chunkOffset": i as u64 * CHUNK,
                    "chunkSize": chunk_size(i),
                    "chunkDigest": digest,
                }));
            }
        }
        if size == 0 {
            self.entries.push(entry);
        }
    }

    /// Ends the blob: the table as the last tar entry in a member of its
    /// own, the archive's end, the footer.
    pub(super) fn finish<W: Write>(
        self,
        mut tar: tar::Builder<Members<W>>,
    ) -> io::Result<Finished<W>> {
        let json = serde_json::to_vec(&json!({"version": 1, "entries": self.entries}))
            .expect("a table serialises");
        let toc_at = tar.get_mut().cut()?;
        let mut header = tar::Header::new_ustar();
        header.set_size(json.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, "stargz.index.json", json.as_slice())?;
        tar.finish()?;
        let (mut out, diff_id, raw_len) = tar.into_inner()?.finish()?;
        out.write_all(&footer(toc_at))?;
        let notes = vec![
            (
                TOC_DIGEST.to_owned(),
                format!("sha256:{}", crate::hex(&Sha256::digest(&json))),
            ),
            (UNCOMPRESSED_SIZE.to_owned(), raw_len.to_string()),
        ];
        Ok(Finished {
            annotations: notes,
            out,
            diff_id,
        })
    }
}

/// The landmark that says no file is to be prefetched: a one-byte file,
/// the first entry.
pub(super) fn no_prefetch_landmark<W: Write>(
    tar: &mut tar::Builder<Members<W>>,
    toc: &mut Toc,
) -> io::Result<()> {
    const NAME: &str = ".no.prefetch.landmark";
    let mut header = tar::Header::new_ustar();
    header.set_size(1);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    let mut data = toc.reader(&[0xf_u8][..]);
    tar.append_data(&mut header, NAME, &mut data)?;
    let meta = Meta {
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime: (0, 0),
        rdev: 0,
    };
    toc.entry(NAME, "reg", &meta, None, &[], Some(data));
    Ok(())
}

/// The footer: an empty gzip member whose extra field holds the table's
/// offset.
fn footer(toc_at: u64) -> Vec<u8> {
    let mut f = vec![
        0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 26, 0, b'S', b'G', 22, 0,
    ];
    f.extend_from_slice(format!("{toc_at:016x}STARGZ").as_bytes());
    // An empty final stored block, then the CRC and size of nothing.
    f.extend_from_slice(&[1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    f
}
