//! zstd:chunked (containers/storage `pkg/chunked`): a zstd tar any zstd
//! decoder unpacks, whose every regular file's data, [`CHUNK`] bytes at a
//! time, is zstd frames of its own ([`super::toc`]); after the archive's
//! end, the table of contents (zstd-compressed) in a skippable frame, and
//! a skippable frame of 64 bytes that says where it is. The descriptor's
//! annotations say the same and pin the table's compressed bytes.
//!
//! No tar-split data is written: newer containers/storage (podman 5) takes
//! a layer without it whole instead of in parts.
//!
//! The annotations are written under both prefixes containers/storage has
//! used ([`PREFIXES`]): podman 4 (Debian 12's 4.3.1) reads only the older
//! one, and pulls such a layer in parts with it; newer readers read the
//! newer one.

use std::io::{self, Write};

use sha2::{Digest, Sha256};

#[cfg(doc)]
use super::toc::CHUNK;
use super::toc::{Finished, Frames, Toc};

/// The annotations' prefixes: containers/storage's current one, and the
/// one older skopeo and podman write and read.
pub(crate) const PREFIXES: [&str; 2] = [
    "io.github.containers.zstd-chunked.",
    "io.containers.zstd-chunked.",
];

/// The annotation that pins the table, under the current prefix.
pub const MANIFEST_CHECKSUM: &str = "io.github.containers.zstd-chunked.manifest-checksum";

/// `ManifestTypeCRFS`: the table is a CRFS table of contents.
const CRFS: u64 = 1;
/// The footer's last 8 bytes.
const FOOTER_MAGIC: &[u8; 8] = b"GNUlInUx";

/// Ends the blob: the archive's end, then the table and the footer, each
/// in a skippable frame.
pub(super) fn finish<W: Write>(
    toc: Toc,
    mut tar: tar::Builder<Frames<W>>,
) -> io::Result<Finished<W>> {
    tar.finish()?;
    let sink = tar.into_inner()?;
    // Every file's frames have ended once the archive's end is written.
    let json = toc.json();
    let (mut out, diff_id, _) = sink.finish()?;
    let level = ruzstd::encoding::CompressionLevel::Fastest;
    let table = ruzstd::encoding::compress_to_vec(&json[..], level);
    if u32::try_from(table.len()).is_err() {
        return Err(io::Error::other(
            "its table of contents is over 4 GiB compressed",
        ));
    }
    let at = out.count + SKIPPABLE_HEADER;
    out.write_all(&skippable(&table))?;
    let mut footer = Vec::with_capacity(64);
    for word in [at, table.len() as u64, json.len() as u64, CRFS, 0, 0, 0] {
        footer.extend_from_slice(&word.to_le_bytes());
    }
    footer.extend_from_slice(FOOTER_MAGIC);
    out.write_all(&skippable(&footer))?;
    let checksum = format!("sha256:{}", crate::hex(&Sha256::digest(&table)));
    let position = format!("{at}:{}:{}:{CRFS}", table.len(), json.len());
    let notes = PREFIXES
        .iter()
        .flat_map(|prefix| {
            [
                (format!("{prefix}manifest-checksum"), checksum.clone()),
                (format!("{prefix}manifest-position"), position.clone()),
            ]
        })
        .collect();
    Ok(Finished {
        annotations: notes,
        out,
        diff_id,
    })
}

/// A skippable frame's magic number and length.
const SKIPPABLE_HEADER: u64 = 8;

/// `data` in a skippable frame (RFC 8878 3.1.2), which a decoder passes over.
fn skippable(data: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(data.len() + SKIPPABLE_HEADER as usize);
    frame.extend_from_slice(&0x184D_2A50u32.to_le_bytes());
    frame.extend_from_slice(&(data.len() as u32).to_le_bytes());
    frame.extend_from_slice(data);
    frame
}
