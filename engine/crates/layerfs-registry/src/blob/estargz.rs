//! eStargz (containerd/stargz-snapshotter `docs/estargz.md`): a gzip tar
//! any tool unpacks, whose every regular file's data, [`CHUNK`] bytes at a
//! time, begins a gzip member of its own ([`super::toc`]); then the table
//! of contents (`stargz.index.json`, the last tar entry, in a member of its
//! own with the archive's end blocks) and the 51-byte footer that points
//! to it.

use std::io::{self, Write};

use sha2::{Digest, Sha256};

#[cfg(doc)]
use super::toc::CHUNK;
use super::toc::{Finished, Frames, Meta, Toc};

/// The annotation that pins the table of contents.
pub const TOC_DIGEST: &str = "containerd.io/snapshot/stargz/toc.digest";
const UNCOMPRESSED_SIZE: &str = "io.containers.estargz.uncompressed-size";

/// Ends the blob: the table as the last tar entry in a member of its own,
/// the archive's end, the footer.
pub(super) fn finish<W: Write>(
    toc: Toc,
    mut tar: tar::Builder<Frames<W>>,
) -> io::Result<Finished<W>> {
    let json = toc.json();
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

/// The landmark that says no file is to be prefetched: a one-byte file,
/// the first entry.
pub(super) fn no_prefetch_landmark<W: Write>(
    tar: &mut tar::Builder<Frames<W>>,
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
