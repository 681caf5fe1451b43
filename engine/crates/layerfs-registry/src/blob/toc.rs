//! A layer as a blob with a table of contents, which a lazy pull reads
//! before anything else and then only the frames it needs: eStargz (gzip
//! members, [`super::estargz`]) or zstd:chunked (zstd frames,
//! [`super::zstd_chunked`]). Any tool unpacks either as a plain tar.
//!
//! The tar is written by the same walk as a plain blob ([`super::Walk`]);
//! only the sink differs: it begins a new frame where a file's data (each
//! [`CHUNK`] bytes of it) is about to be written, which the file's reader
//! announces as it is first read (the tar writer reads data only once its
//! header is out). For zstd:chunked a frame also ends where a file's data
//! ends, so a file's frames hold its data alone.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::rc::Rc;

use base64::Engine;
use sha2::{Digest, Sha256};

use crate::crfs::TocEntry;

use super::Hashing;

/// The most data of one file in one frame: a read fetches at most this
/// much more than it needs.
pub(crate) const CHUNK: u64 = 4 << 20;

/// The most a zstd frame of tar headers alone holds before it is ended:
/// compressed a frame at a time, whatever the layer, in bounded memory.
const HEADERS_FRAME: usize = 2 * CHUNK as usize;

/// The two layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    Estargz,
    ZstdChunked,
}

/// Where the sink is to begin a frame before the next byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// A chunk of a file's data begins.
    Data,
    /// A file's data has ended (zstd:chunked).
    End,
}

/// What the sink and the readers of files' data share: whether a frame is
/// to begin before the next byte, where each chunk's frame began, and where
/// every frame began.
#[derive(Default)]
struct Cuts {
    pending: Option<Cut>,
    starts: Vec<u64>,
    all: Vec<u64>,
}

/// The frame under way.
enum Frame<W: Write> {
    Gzip(flate2::write::GzEncoder<Hashing<W>>),
    /// Compressed when it ends: ruzstd's encoder reads from a source.
    Zstd {
        out: Hashing<W>,
        raw: Vec<u8>,
    },
}

impl<W: Write> Frame<W> {
    fn begin(out: Hashing<W>, layout: Layout) -> Frame<W> {
        match layout {
            Layout::Estargz => {
                Frame::Gzip(flate2::GzBuilder::new().write(out, flate2::Compression::fast()))
            }
            Layout::ZstdChunked => Frame::Zstd {
                out,
                raw: Vec::new(),
            },
        }
    }

    fn end(self) -> io::Result<Hashing<W>> {
        match self {
            Frame::Gzip(member) => member.finish(),
            Frame::Zstd { mut out, raw } => {
                if !raw.is_empty() {
                    let level = ruzstd::encoding::CompressionLevel::Fastest;
                    out.write_all(&ruzstd::encoding::compress_to_vec(&raw[..], level))?;
                }
                Ok(out)
            }
        }
    }
}

/// The sink of the tar stream: frames one after another into `out`, the
/// uncompressed bytes hashed (the `diff_id`).
pub(super) struct Frames<W: Write> {
    frame: Option<Frame<W>>,
    layout: Layout,
    raw: Sha256,
    raw_len: u64,
    cuts: Rc<RefCell<Cuts>>,
}

impl<W: Write> Frames<W> {
    fn new(out: Hashing<W>, layout: Layout) -> Self {
        Frames {
            frame: Some(Frame::begin(out, layout)),
            layout,
            raw: Sha256::new(),
            raw_len: 0,
            cuts: Rc::default(),
        }
    }

    /// Ends the frame under way and begins another; returns where it begins.
    pub(super) fn cut(&mut self) -> io::Result<u64> {
        let out = self.frame.take().expect("a frame is open").end()?;
        let at = out.count;
        self.frame = Some(Frame::begin(out, self.layout));
        self.cuts.borrow_mut().all.push(at);
        Ok(at)
    }

    /// Ends the last frame; the compressed stream, the `diff_id`, and the
    /// uncompressed length.
    pub(super) fn finish(mut self) -> io::Result<(Hashing<W>, String, u64)> {
        let out = self.frame.take().expect("a frame is open").end()?;
        let diff_id = format!("sha256:{}", crate::hex(&self.raw.finalize()));
        Ok((out, diff_id, self.raw_len))
    }
}

impl<W: Write> Write for Frames<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let pending = self.cuts.borrow_mut().pending.take();
        if let Some(cut) = pending {
            let at = self.cut()?;
            if cut == Cut::Data {
                self.cuts.borrow_mut().starts.push(at);
            }
        }
        let n = match self.frame.as_mut().expect("a frame is open") {
            Frame::Gzip(member) => member.write(buf)?,
            Frame::Zstd { raw, .. } => {
                raw.extend_from_slice(buf);
                buf.len()
            }
        };
        self.raw.update(&buf[..n]);
        self.raw_len += n as u64;
        if matches!(&self.frame, Some(Frame::Zstd { raw, .. }) if raw.len() >= HEADERS_FRAME) {
            self.cut()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.frame.as_mut().expect("a frame is open") {
            Frame::Gzip(member) => member.flush(),
            Frame::Zstd { .. } => Ok(()),
        }
    }
}

/// A regular file's data as the tar writer reads it: a frame is announced
/// before each chunk's first byte (and, for zstd:chunked, after its last);
/// the file's and each chunk's digests are taken on the way.
pub(super) struct ChunkedFile<R> {
    file: R,
    at: u64,
    cuts: Rc<RefCell<Cuts>>,
    cut_at_end: bool,
    whole: Sha256,
    chunk: Sha256,
    chunks: Vec<String>,
}

impl<R: Read> Read for ChunkedFile<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = (CHUNK - self.at % CHUNK).min(buf.len() as u64) as usize;
        let n = self.file.read(&mut buf[..room])?;
        if n == 0 {
            if self.cut_at_end && self.at > 0 {
                self.cuts.borrow_mut().pending = Some(Cut::End);
            }
            return Ok(0);
        }
        if self.at.is_multiple_of(CHUNK) {
            self.cuts.borrow_mut().pending = Some(Cut::Data);
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

/// A written blob: its descriptor's annotations, its compressed stream,
/// and its `diff_id`.
pub(super) struct Finished<W> {
    pub annotations: Vec<(String, String)>,
    pub out: Hashing<W>,
    pub diff_id: String,
}

/// The table side of a layer's walk: its entries as they come.
pub(super) struct Toc {
    layout: Layout,
    cuts: Rc<RefCell<Cuts>>,
    entries: Vec<TocEntry>,
    /// zstd:chunked: each entry whose `endOffset` is the end of the frame
    /// that begins at the position given, known once the next one begins.
    open_ends: Vec<(usize, u64)>,
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
    /// The sink for a walk's tar in `layout`, and the table it fills.
    pub(super) fn new<W: Write>(out: Hashing<W>, layout: Layout) -> (Frames<W>, Toc) {
        let sink = Frames::new(out, layout);
        let toc = Toc {
            layout,
            cuts: sink.cuts.clone(),
            entries: Vec::new(),
            open_ends: Vec::new(),
        };
        (sink, toc)
    }

    /// The reader of a regular file's data for the tar writer.
    pub(super) fn reader<R: Read>(&self, file: R) -> ChunkedFile<R> {
        ChunkedFile {
            file,
            at: 0,
            cuts: self.cuts.clone(),
            cut_at_end: self.layout == Layout::ZstdChunked,
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
        let mut entry = TocEntry {
            name: name.to_owned(),
            kind: kind.to_owned(),
            mode: meta.mode.into(),
            uid: meta.uid,
            gid: meta.gid,
            modtime: chrono::DateTime::from_timestamp(meta.mtime.0, meta.mtime.1)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
            link_name: link.map(str::to_owned),
            ..TocEntry::default()
        };
        if kind == "char" || kind == "block" {
            let rdev = meta.rdev as _;
            entry.dev_major = rustix::fs::major(rdev);
            entry.dev_minor = rustix::fs::minor(rdev);
        }
        if !xattrs.is_empty() {
            let encoded = xattrs.iter().map(|(n, v)| {
                (
                    n.clone(),
                    base64::engine::general_purpose::STANDARD.encode(v),
                )
            });
            entry.xattrs = Some(encoded.collect());
        }
        let Some(mut data) = data else {
            self.entries.push(entry);
            return;
        };
        if !data.at.is_multiple_of(CHUNK) {
            data.end_chunk();
        }
        let size = data.at;
        entry.size = size;
        let digest = format!("sha256:{}", crate::hex(&data.whole.finalize()));
        let starts = std::mem::take(&mut self.cuts.borrow_mut().starts);
        if size == 0 {
            // zstd:chunked leaves an empty file's digest out.
            if self.layout == Layout::Estargz {
                entry.digest = Some(digest);
            }
            self.entries.push(entry);
            return;
        }
        entry.digest = Some(digest);
        let last = data.chunks.len() - 1;
        // eStargz leaves the last chunk's size 0 (the rest of the file), and
        // names a file's one chunk; zstd:chunked gives each its size, and
        // names chunks only when there are several (as containers/storage
        // writes it).
        let chunk_size = |i: usize| match (self.layout, i == last) {
            (Layout::Estargz, true) => 0,
            (_, true) => size - i as u64 * CHUNK,
            (_, false) => CHUNK,
        };
        let chunked = self.layout == Layout::Estargz || last > 0;
        let first = self.entries.len();
        for (i, (&start, digest)) in starts.iter().zip(&data.chunks).enumerate() {
            let mut piece = if i == 0 {
                std::mem::take(&mut entry)
            } else {
                TocEntry {
                    name: name.to_owned(),
                    kind: "chunk".to_owned(),
                    chunk_offset: i as u64 * CHUNK,
                    ..TocEntry::default()
                }
            };
            piece.offset = start;
            if chunked {
                piece.chunk_size = chunk_size(i);
                piece.chunk_digest = Some(digest.clone());
            }
            if self.layout == Layout::ZstdChunked && i == last {
                // The file's frames end where its last chunk's frame does.
                self.open_ends.push((first, start));
            }
            self.entries.push(piece);
        }
    }

    /// The table's JSON: every `endOffset` filled in, now that every frame
    /// of the files has begun and ended.
    pub(super) fn json(mut self) -> Vec<u8> {
        let all = std::mem::take(&mut self.cuts.borrow_mut().all);
        for (entry, start) in std::mem::take(&mut self.open_ends) {
            let end = all.get(all.partition_point(|&c| c <= start)).copied();
            self.entries[entry].end_offset = end.expect("a file's frame ends");
        }
        let toc = crate::crfs::Toc {
            version: 1,
            entries: self.entries,
        };
        serde_json::to_vec(&toc).expect("a table serialises")
    }
}
