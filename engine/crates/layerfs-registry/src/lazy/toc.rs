//! A layer's table of contents: found, checked against the digest its
//! descriptor pins, and read into the tree of a lazy layer.
//!
//! Two formats carry one, both in the CRFS table's JSON:
//! - eStargz (a gzip layer): the table is the last tar entry,
//!   `stargz.index.json`, in a gzip member that the blob's 51-byte footer
//!   points to; the annotation `containerd.io/snapshot/stargz/toc.digest`
//!   is the digest of the JSON. Each file (or chunk of one) is its own gzip
//!   member at `offset`, ending where the next one begins.
//! - zstd:chunked (a zstd layer): the table is a zstd frame inside a
//!   skippable frame, where the annotation
//!   `io.github.containers.zstd-chunked.manifest-position` (or
//!   `io.containers.zstd-chunked.`, as older writers name it) says
//!   (`offset:length:uncompressed:type`); `...-manifest-checksum` is the
//!   digest of its compressed bytes. Each file's data is the frames at
//!   `offset..endOffset`, checked by the file's `digest`.
//!
//! The manifest's digest pins the annotations, they pin the table, and the
//! table pins every piece: nothing read lazily is taken on trust.

use std::io::Read;
use std::path::PathBuf;

use base64::Engine;
use layerfs_layers::lazy::{check_pieces, parse_digest, Entry, EntryKind, Piece};
use oci_client::manifest::OciDescriptor;
use sha2::{Digest, Sha256};

use crate::crfs::Toc;
use crate::decompress::Compression;
use crate::{Error, ErrorKind};

/// The largest table of contents taken, uncompressed: far above one for a
/// million files.
pub const MAX_TOC: u64 = 256 * 1024 * 1024;

pub(crate) const ESTARGZ_TOC_DIGEST: &str = "containerd.io/snapshot/stargz/toc.digest";

/// Entries the lazy formats add to a layer's tar for their readers, not
/// files of the image: eStargz's table and the landmarks that say which
/// files to prefetch. stargz-snapshotter and podman's partial pull show
/// none of them; a pull (lazy or whole) of such a layer leaves them out.
pub(crate) const METADATA: [&str; 3] = [
    "stargz.index.json",
    ".prefetch.landmark",
    ".no.prefetch.landmark",
];

/// Whether tar entry `name` is one of the formats' [`METADATA`].
pub(crate) fn is_metadata(name: &str) -> bool {
    METADATA.contains(&name.trim_start_matches("./").trim_start_matches('/'))
}

/// The size of an eStargz blob's footer.
pub(crate) const ESTARGZ_FOOTER: u64 = 51;

/// How a layer can be read lazily, from its descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// The table's JSON digest.
    Estargz { toc_digest: String },
    /// Where the compressed table is, and its digest.
    ZstdChunked {
        offset: u64,
        length: u64,
        checksum: String,
    },
}

impl Format {
    /// The lazy format `layer`'s descriptor announces, if any.
    pub(crate) fn of(layer: &OciDescriptor) -> Result<Option<Format>, Error> {
        let Some(notes) = &layer.annotations else {
            return Ok(None);
        };
        let compression = Compression::of(&layer.media_type)?;
        if let (Compression::Gzip, Some(digest)) = (compression, notes.get(ESTARGZ_TOC_DIGEST)) {
            return Ok(Some(Format::Estargz {
                toc_digest: digest.clone(),
            }));
        }
        let note = |name: &str| {
            crate::blob::ZSTD_CHUNKED_PREFIXES
                .iter()
                .find_map(|prefix| notes.get(&format!("{prefix}{name}")))
        };
        let (Compression::Zstd, Some(position), Some(checksum)) = (
            compression,
            note("manifest-position"),
            note("manifest-checksum"),
        ) else {
            return Ok(None);
        };
        let fields: Vec<&str> = position.split(':').collect();
        let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        match (number(0), number(1), number(3)) {
            (Some(offset), Some(length), Some(1)) => Ok(Some(Format::ZstdChunked {
                offset,
                length,
                checksum: checksum.clone(),
            })),
            _ => Err(bad(format!(
                "its zstd:chunked position {position:?} cannot be read"
            ))),
        }
    }
}

fn bad(why: String) -> Error {
    Error::new(ErrorKind::Registry, why)
}

/// Where an eStargz table begins, from the blob's footer.
pub(crate) fn estargz_toc_offset(footer: &[u8]) -> Result<u64, Error> {
    let broken = || bad("its eStargz footer cannot be read".into());
    if footer.len() != ESTARGZ_FOOTER as usize || footer[..2] != [0x1f, 0x8b] || footer[3] & 4 == 0
    {
        return Err(broken());
    }
    let extra = &footer[10..];
    if extra[..2] != [26, 0] || &extra[2..4] != b"SG" || extra[4..6] != [22, 0] {
        return Err(broken());
    }
    let field = &extra[6..28];
    if &field[16..] != b"STARGZ" {
        return Err(broken());
    }
    let hex = std::str::from_utf8(&field[..16]).map_err(|_| broken())?;
    u64::from_str_radix(hex, 16).map_err(|_| broken())
}

/// The JSON of an eStargz table from the gzip member(s) holding its tar
/// entry, checked against `digest`.
pub(crate) fn estargz_toc_json(member: &[u8], digest: &str) -> Result<Vec<u8>, Error> {
    let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(member));
    let broken = |e: &dyn std::fmt::Display| bad(format!("its eStargz table cannot be read: {e}"));
    let mut entries = archive.entries().map_err(|e| broken(&e))?;
    let mut entry = entries
        .next()
        .ok_or_else(|| broken(&"no tar entry"))?
        .map_err(|e| broken(&e))?;
    let named = entry.path_bytes().as_ref() == b"stargz.index.json";
    if !named || entry.size() > MAX_TOC {
        return Err(broken(&"no stargz.index.json of a size taken"));
    }
    let mut json = Vec::new();
    entry
        .by_ref()
        .take(MAX_TOC)
        .read_to_end(&mut json)
        .map_err(|e| broken(&e))?;
    pinned(&json, digest, "eStargz table")?;
    Ok(json)
}

/// The JSON of a zstd:chunked table from its compressed bytes, checked
/// against `checksum` first.
pub(crate) fn zstd_chunked_toc_json(compressed: &[u8], checksum: &str) -> Result<Vec<u8>, Error> {
    pinned(compressed, checksum, "zstd:chunked table")?;
    let mut json = Vec::new();
    Compression::Zstd
        .decoder(compressed)
        .take(MAX_TOC + 1)
        .read_to_end(&mut json)
        .map_err(|e| bad(format!("its zstd:chunked table cannot be read: {e}")))?;
    if json.len() as u64 > MAX_TOC {
        return Err(bad(format!(
            "its table of contents is over {MAX_TOC} bytes"
        )));
    }
    Ok(json)
}

fn pinned(bytes: &[u8], digest: &str, what: &str) -> Result<(), Error> {
    let actual: [u8; 32] = Sha256::digest(bytes).into();
    match parse_digest(digest) {
        Some(expected) if expected == actual => Ok(()),
        _ => Err(bad(format!(
            "its {what} does not match the digest {digest} its descriptor names"
        ))),
    }
}

/// The tree `json` describes, each file's pieces where `format` puts them
/// in a blob of `blob_size` bytes whose table begins at `toc_offset`.
pub(crate) fn entries(
    json: &[u8],
    format: &Format,
    blob_size: u64,
    toc_offset: u64,
) -> Result<Vec<Entry>, Error> {
    let toc: Toc = serde_json::from_slice(json)
        .map_err(|e| bad(format!("its table of contents cannot be read: {e}")))?;
    if toc.version != 1 {
        return Err(bad(format!(
            "its table of contents is version {}, not 1",
            toc.version
        )));
    }
    // A piece ends where the next begins, the last at the table: each of
    // eStargz's files and chunks is a gzip member, and a zstd:chunked table
    // with no `endOffset` (stargz-snapshotter's writer) is laid out alike,
    // in zstd frames.
    let mut starts: Vec<u64> = toc
        .entries
        .iter()
        .filter(|e| matches!(e.kind.as_str(), "reg" | "chunk") && e.offset > 0)
        .map(|e| e.offset)
        .chain([toc_offset])
        .collect();
    starts.sort_unstable();
    starts.dedup();
    let end_of = |start: u64| starts.get(starts.partition_point(|&s| s <= start)).copied();

    let mut out: Vec<Entry> = Vec::with_capacity(toc.entries.len());
    // The last file: whether it is the formats' metadata (left out, its
    // chunks too), and whether its chunks are pieces of their own.
    let (mut metadata, mut piecewise) = (false, false);
    for e in &toc.entries {
        let named = |why: String| bad(format!("its table of contents: {:?}: {why}", e.name));
        if e.kind == "chunk" {
            if metadata {
                continue;
            }
            let Some(EntryKind::File { pieces, size, .. }) = out.last_mut().map(|f| &mut f.kind)
            else {
                return Err(named("a chunk with no file before it".into()));
            };
            if piecewise {
                let start = e.offset;
                let end = end_of(start).ok_or_else(|| named("a chunk past the table".into()))?;
                // The last chunk's size is left 0: the rest of the file.
                let len = match e.chunk_size {
                    0 => size.saturating_sub(e.chunk_offset),
                    n => n,
                };
                pieces.push(Piece {
                    at: e.chunk_offset,
                    len,
                    start,
                    end,
                    skip: e.inner_offset,
                    digest: e.chunk_digest.clone().unwrap_or_default(),
                });
            }
            continue;
        }
        metadata = is_metadata(&e.name);
        if metadata {
            continue;
        }
        // containers/storage's zstd:chunked gives each file its frames'
        // end, and a digest of the whole file checks them.
        piecewise = matches!(format, Format::Estargz { .. }) || e.end_offset == 0;
        let kind = match e.kind.as_str() {
            "dir" => EntryKind::Dir,
            "reg" => {
                let content = match (&e.digest, e.size) {
                    (Some(d), _) => {
                        parse_digest(d).ok_or_else(|| named(format!("digest {d:?}")))?
                    }
                    (None, 0) => Sha256::digest(b"").into(),
                    (None, _) => return Err(named("a file with no digest".into())),
                };
                let mut pieces = Vec::new();
                if e.size > 0 && piecewise {
                    let end =
                        end_of(e.offset).ok_or_else(|| named("a file past the table".into()))?;
                    let len = match e.chunk_size {
                        0 => e.size,
                        n => n.min(e.size),
                    };
                    // A file of one piece may carry only its own digest.
                    let whole = (len == e.size).then(|| e.digest.clone()).flatten();
                    pieces.push(Piece {
                        at: 0,
                        len,
                        start: e.offset,
                        end,
                        skip: e.inner_offset,
                        digest: e.chunk_digest.clone().or(whole).unwrap_or_default(),
                    });
                } else if e.size > 0 {
                    // The file's frames, whole: its own digest checks them.
                    pieces.push(Piece {
                        at: 0,
                        len: e.size,
                        start: e.offset,
                        end: e.end_offset,
                        skip: 0,
                        digest: e.digest.clone().unwrap_or_default(),
                    });
                }
                EntryKind::File {
                    size: e.size,
                    content,
                    pieces,
                }
            }
            "symlink" => EntryKind::Symlink(PathBuf::from(e.link_name.clone().unwrap_or_default())),
            "hardlink" => {
                EntryKind::HardLink(PathBuf::from(e.link_name.clone().unwrap_or_default()))
            }
            "fifo" => EntryKind::Fifo,
            "char" => EntryKind::CharDevice(rustix::fs::makedev(e.dev_major, e.dev_minor) as u64),
            "block" => EntryKind::BlockDevice(rustix::fs::makedev(e.dev_major, e.dev_minor) as u64),
            other => return Err(named(format!("unknown type {other:?}"))),
        };
        let mut xattrs = Vec::new();
        for (name, value) in e.xattrs.iter().flatten() {
            let value = base64::engine::general_purpose::STANDARD
                .decode(value)
                .map_err(|_| named(format!("attribute {name}: not base64")))?;
            xattrs.push((name.into(), value));
        }
        xattrs.sort();
        let mtime = e
            .modtime
            .as_deref()
            .filter(|t| !t.is_empty())
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| rustix::fs::Timespec {
                tv_sec: t.timestamp() as _,
                tv_nsec: t.timestamp_subsec_nanos() as _,
            });
        out.push(Entry {
            path: PathBuf::from(&e.name),
            kind,
            mode: (e.mode & 0o7777) as u32,
            uid: e.uid,
            gid: e.gid,
            mtime,
            xattrs,
        });
    }
    for entry in &out {
        if let EntryKind::File { size, pieces, .. } = &entry.kind {
            check_pieces(pieces, *size, blob_size).map_err(|why| {
                bad(format!(
                    "its table of contents: {}: {why}",
                    entry.path.display()
                ))
            })?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn footer(offset: u64) -> Vec<u8> {
        let mut f = vec![
            0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 26, 0, b'S', b'G', 22, 0,
        ];
        f.extend_from_slice(format!("{offset:016x}STARGZ").as_bytes());
        f.extend_from_slice(&[1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
        f
    }

    #[test]
    fn an_estargz_footer_gives_the_table_offset_and_a_wrong_one_is_refused() {
        assert_eq!(footer(0x1234).len(), ESTARGZ_FOOTER as usize);
        assert_eq!(estargz_toc_offset(&footer(0x1234)).unwrap(), 0x1234);
        let mut bad = footer(7);
        bad[12] = b'X';
        assert!(estargz_toc_offset(&bad).is_err());
        assert!(estargz_toc_offset(&footer(7)[..50]).is_err());
    }

    fn estargz() -> Format {
        Format::Estargz {
            toc_digest: String::new(),
        }
    }

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn files_packed_into_one_member_are_read_past_their_inner_offset() {
        use std::io::Write;
        // Two small files in one gzip member, as stargz-snapshotter packs
        // files under its minimum chunk size: the second at innerOffset 5.
        let mut member = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        member.write_all(b"firstsecond!").unwrap();
        let mut blob = vec![0u8; 10];
        blob.extend(member.finish().unwrap());
        let toc_at = blob.len() as u64;
        let sha = |b: &[u8]| format!("sha256:{}", crate::hex(&Sha256::digest(b)));
        let json = format!(
            r#"{{"version":1,"entries":[
            {{"name":"a","type":"reg","size":5,"offset":10,"digest":"{}","chunkDigest":"{}"}},
            {{"name":"b","type":"reg","size":7,"offset":10,"innerOffset":5,"digest":"{}","chunkDigest":"{}"}}
            ]}}"#,
            sha(b"first"),
            sha(b"first"),
            sha(b"second!"),
            sha(b"second!")
        );
        let tree = entries(json.as_bytes(), &estargz(), toc_at + 100, toc_at).unwrap();
        for (entry, want) in tree.iter().zip([&b"first"[..], b"second!"]) {
            let EntryKind::File { pieces, .. } = &entry.kind else {
                panic!("not a file: {entry:?}");
            };
            let [piece] = &pieces[..] else {
                panic!("{entry:?}: one piece")
            };
            assert_eq!((piece.start, piece.end), (10, toc_at), "{entry:?}");
            let range = &blob[piece.start as usize..piece.end as usize];
            assert_eq!(Compression::Gzip.piece(range, piece).unwrap(), want);
        }
    }

    #[test]
    fn an_estargz_table_gives_the_tree_and_each_chunk_ends_where_the_next_begins() {
        let json = format!(
            r#"{{"version":1,"entries":[
            {{"name":"bin/","type":"dir","mode":16877,"modtime":"2019-08-20T10:30:43.5Z"}},
            {{"name":"bin/big","type":"reg","size":10,"mode":33261,"uid":1,"gid":2,
              "offset":100,"chunkSize":6,"digest":"{D}","chunkDigest":"{D}",
              "xattrs":{{"user.a":"eQ=="}}}},
            {{"name":"bin/big","type":"chunk","offset":150,"chunkOffset":6,"chunkSize":0,"chunkDigest":"{D}"}},
            {{"name":"bin/link","type":"symlink","linkName":"big","mode":41471}},
            {{"name":"bin/hard","type":"hardlink","linkName":"bin/big"}},
            {{"name":"empty","type":"reg","size":0,"mode":420}}
            ]}}"#
        );
        let entries = entries(json.as_bytes(), &estargz(), 1000, 400).unwrap();
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[0].mode, 0o755);
        assert_eq!(entries[0].mtime.unwrap().tv_nsec, 500_000_000);
        let EntryKind::File { size, pieces, .. } = &entries[1].kind else {
            panic!("not a file: {:?}", entries[1]);
        };
        assert_eq!(*size, 10);
        assert_eq!(
            (entries[1].uid, entries[1].gid, entries[1].mode),
            (1, 2, 0o755)
        );
        assert_eq!(entries[1].xattrs, vec![("user.a".into(), b"y".to_vec())]);
        let spans: Vec<_> = pieces
            .iter()
            .map(|p| (p.at, p.len, p.start, p.end))
            .collect();
        assert_eq!(spans, vec![(0, 6, 100, 150), (6, 4, 150, 400)]);
        assert!(
            matches!(&entries[2].kind, EntryKind::Symlink(t) if t == std::path::Path::new("big"))
        );
        assert!(
            matches!(&entries[3].kind, EntryKind::HardLink(t) if t == std::path::Path::new("bin/big"))
        );
        assert!(
            matches!(&entries[4].kind, EntryKind::File { size: 0, pieces, .. } if pieces.is_empty())
        );
    }

    #[test]
    fn a_zstd_chunked_file_is_one_piece_checked_by_its_own_digest() {
        let json = format!(
            r#"{{"version":1,"entries":[
            {{"name":"f","type":"reg","size":3,"digest":"{D}","offset":10,"endOffset":30}},
            {{"name":"f","type":"chunk","offset":20,"endOffset":30,"chunkOffset":2,"chunkSize":1}}
            ]}}"#
        );
        let format = Format::ZstdChunked {
            offset: 0,
            length: 0,
            checksum: String::new(),
        };
        let entries = entries(json.as_bytes(), &format, 100, 90).unwrap();
        let EntryKind::File { pieces, .. } = &entries[0].kind else {
            panic!()
        };
        assert_eq!(pieces.len(), 1);
        assert_eq!((pieces[0].len, pieces[0].start, pieces[0].end), (3, 10, 30));
        assert_eq!(pieces[0].digest, D);
    }

    #[test]
    fn a_zstd_chunked_table_without_end_offsets_is_read_as_stargz_snapshotter_writes_it() {
        // ctr-remote's zstd:chunked: eStargz's layout in zstd frames, each
        // file or chunk ending where the next begins, the last at the table.
        let json = format!(
            r#"{{"version":1,"entries":[
            {{"name":".no.prefetch.landmark","type":"reg","size":1,"offset":96,"digest":"{D}","chunkDigest":"{D}"}},
            {{"name":"big","type":"reg","size":10,"offset":140,"chunkSize":6,"digest":"{D}","chunkDigest":"{D}"}},
            {{"name":"big","type":"chunk","offset":180,"chunkOffset":6,"chunkDigest":"{D}"}},
            {{"name":"small","type":"reg","size":3,"offset":230,"digest":"{D}"}}
            ]}}"#
        );
        let format = Format::ZstdChunked {
            offset: 300,
            length: 50,
            checksum: String::new(),
        };
        let entries = entries(json.as_bytes(), &format, 400, 300).unwrap();
        let spans = |i: usize| -> Vec<_> {
            let EntryKind::File { pieces, .. } = &entries[i].kind else {
                panic!("not a file: {:?}", entries[i]);
            };
            pieces
                .iter()
                .map(|p| (p.at, p.len, p.start, p.end, p.digest.as_str()))
                .collect()
        };
        let names: Vec<_> = entries.iter().map(|e| e.path.clone()).collect();
        assert_eq!(names, [PathBuf::from("big"), PathBuf::from("small")]);
        assert_eq!(spans(0), [(0, 6, 140, 180, D), (6, 4, 180, 230, D)]);
        // A file of one piece with no chunk digest: its own digest checks it.
        assert_eq!(spans(1), [(0, 3, 230, 300, D)]);
    }

    #[test]
    fn the_formats_metadata_is_no_file_of_the_tree() {
        let json = format!(
            r#"{{"version":1,"entries":[
            {{"name":"./.prefetch.landmark","type":"reg","size":1,"offset":50,"chunkDigest":"{D}"}},
            {{"name":".no.prefetch.landmark","type":"reg","size":1,"offset":60,"chunkDigest":"{D}"}},
            {{"name":"stargz.index.json","type":"reg","size":9,"offset":70,"chunkSize":4,"chunkDigest":"{D}"}},
            {{"name":"stargz.index.json","type":"chunk","offset":80,"chunkOffset":4,"chunkDigest":"{D}"}},
            {{"name":"d/","type":"dir","mode":16877}},
            {{"name":"d/stargz.index.json","type":"reg","size":1,"offset":90,"digest":"{D}","chunkDigest":"{D}"}}
            ]}}"#
        );
        let entries = entries(json.as_bytes(), &estargz(), 200, 100).unwrap();
        let names: Vec<_> = entries.iter().map(|e| e.path.clone()).collect();
        // Only at the root: a file of that name elsewhere is the image's.
        assert_eq!(
            names,
            [PathBuf::from("d/"), PathBuf::from("d/stargz.index.json")]
        );
    }

    #[test]
    fn a_table_that_points_outside_the_blob_or_is_broken_is_refused_in_one_line() {
        let outside = format!(
            r#"{{"version":1,"entries":[{{"name":"f","type":"reg","size":3,"digest":"{D}","offset":10,"endOffset":300}}]}}"#
        );
        let format = Format::ZstdChunked {
            offset: 0,
            length: 0,
            checksum: String::new(),
        };
        let e = entries(outside.as_bytes(), &format, 100, 90).unwrap_err();
        assert!(e.message.contains("outside the blob"), "{}", e.message);
        for broken in [
            r#"{"version":2,"entries":[]}"#,
            r#"{"version":1,"entries":[{"name":"x","type":"chunk","offset":1}]}"#,
            r#"{"version":1,"entries":[{"name":"x","type":"sock"}]}"#,
            r#"{"version":1,"entries":[{"name":"x","type":"reg","size":5}]}"#,
            "not json",
        ] {
            let e = entries(broken.as_bytes(), &estargz(), 100, 90).unwrap_err();
            assert!(!e.message.contains('\n'), "{}", e.message);
        }
    }

    #[test]
    fn a_table_must_match_the_digest_its_descriptor_pins() {
        let json = br#"{"version":1,"entries":[]}"#;
        let right = format!("sha256:{:x}", Sha256::digest(json));
        assert!(pinned(json, &right, "table").is_ok());
        assert!(pinned(json, D, "table")
            .unwrap_err()
            .message
            .contains("does not match"));
    }
}
