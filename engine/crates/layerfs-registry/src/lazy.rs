//! Lazy pull: a layer whose blob carries a table of contents (eStargz,
//! zstd:chunked) becomes a lazy layer in the store from the table alone;
//! its files' data comes from the registry when first read, or when the
//! daemon completes the layer.

use std::path::PathBuf;
use std::sync::Arc;

use layerfs_layers::lazy::{Fetch, Source};
use layerfs_layers::{LayerId, Store};
use oci_client::manifest::OciDescriptor;
use serde::{Deserialize, Serialize};

use crate::session::Session;
use crate::{Error, Transport};

mod remote;
pub(crate) mod toc;

pub(crate) use toc::Format;
pub use toc::MAX_TOC;

/// Where a lazy layer's blob is in its registry: what the store keeps in
/// the layer's [`Source`] (beside the image reference, its name) to reach
/// it again, after a restart too. Credentials are not here: they are found
/// for the registry, as a pull finds them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct BlobPlace {
    /// The image it was pulled as (`registry/repository:tag`).
    #[serde(skip)]
    pub reference: String,
    /// The blob's digest and size.
    pub blob: String,
    pub size: u64,
    /// How a piece is compressed, as its descriptor says. (An index
    /// written before may also hold `format`, which nothing reads.)
    pub media_type: String,
    /// Its registry is reached over plain HTTP (as the pull was asked).
    #[serde(default)]
    pub insecure: bool,
    /// Any certificate is taken from its registry (as the pull was asked).
    #[serde(default)]
    pub no_tls_verify: bool,
}

impl BlobPlace {
    /// The place `source` keeps.
    fn of(source: &Source) -> Result<BlobPlace, Error> {
        let place = serde_json::Value::Object(source.place.clone());
        let place: BlobPlace = serde_json::from_value(place).map_err(|e| {
            Error::new(
                crate::ErrorKind::Store,
                format!("lazy layer of {}: its blob's place: {e}", source.name),
            )
        })?;
        Ok(BlobPlace {
            reference: source.name.clone(),
            ..place
        })
    }

    /// The layer's [`Source`] that keeps this place.
    fn source(&self) -> Source {
        let place = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(place)) => place,
            _ => unreachable!("a struct of plain fields serializes to an object"),
        };
        Source {
            name: self.reference.clone(),
            place,
        }
    }
}

/// What brings lazy layer data from `source`'s registry, reached as the
/// pull that made it was (plain HTTP, certificates), trusting the extra
/// authorities in `ca_file`, with the credentials stored for the registry.
pub fn fetcher(source: &Source, ca_file: Option<PathBuf>) -> Result<Arc<dyn Fetch>, Error> {
    let place = BlobPlace::of(source)?;
    let registry = crate::reference::parse(&place.reference)?
        .resolve_registry()
        .to_owned();
    let transport = Transport {
        insecure: if place.insecure {
            vec![registry]
        } else {
            Vec::new()
        },
        no_tls_verify: place.no_tls_verify,
        ca_file,
    };
    Ok(Arc::new(remote::Remote::open(&place, &transport)?))
}

/// Reads `blob`'s table of contents (the only bytes of it fetched) and makes
/// the lazy layer it describes.
pub(crate) fn import(
    store: &Store,
    session: &Session,
    transport: &Transport,
    blob: &OciDescriptor,
    format: &Format,
) -> Result<LayerId, Error> {
    let size = blob.size.max(0) as u64;
    let place = BlobPlace {
        reference: session.image.whole(),
        blob: blob.digest.clone(),
        size,
        media_type: blob.media_type.clone(),
        insecure: transport.insecure.contains(&session.registry),
        no_tls_verify: transport.no_tls_verify,
    };
    let remote = remote::Remote::open(&place, transport)?;
    let (json, toc_offset) = match format {
        Format::Estargz { toc_digest } => {
            if size < toc::ESTARGZ_FOOTER {
                return Err(Error::new(
                    crate::ErrorKind::Registry,
                    "its eStargz blob is too short",
                ));
            }
            let footer = remote.range(size - toc::ESTARGZ_FOOTER, size)?;
            let offset = toc::estargz_toc_offset(&footer)?;
            let end = size - toc::ESTARGZ_FOOTER;
            if offset >= end || end - offset > MAX_TOC {
                return Err(Error::new(
                    crate::ErrorKind::Registry,
                    format!("its eStargz table at {offset} is not inside the blob, or is over {MAX_TOC} bytes"),
                ));
            }
            let json = toc::estargz_toc_json(&remote.range(offset, end)?, toc_digest)?;
            (json, offset)
        }
        Format::ZstdChunked {
            offset,
            length,
            checksum,
        } => {
            let end = offset
                .checked_add(*length)
                .filter(|&e| e <= size && *length <= MAX_TOC);
            let Some(end) = end else {
                return Err(Error::new(
                    crate::ErrorKind::Registry,
                    format!("its zstd:chunked table at {offset}+{length} is not inside the blob, or is over {MAX_TOC} bytes"),
                ));
            };
            let json = toc::zstd_chunked_toc_json(&remote.range(*offset, end)?, checksum)?;
            (json, *offset)
        }
    };
    let entries = toc::entries(&json, format, size, toc_offset)?;
    store
        .import_lazy(&entries, &place.source())
        .map_err(Error::unpacking)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index an earlier daemon wrote (with the `format` it no longer
    /// writes) still gives the blob's place; a place kept and read back is
    /// the same.
    #[test]
    fn a_blob_place_is_kept_in_the_source_and_read_back() {
        let written = r#"{"reference": "127.0.0.1:5000/lazy/zc:v1",
            "blob": "sha256:ab", "size": 12, "format": "zstd:chunked",
            "media_type": "application/vnd.oci.image.layer.v1.tar+zstd",
            "insecure": true}"#;
        let source: Source = serde_json::from_str(written).unwrap();
        assert_eq!(source.name, "127.0.0.1:5000/lazy/zc:v1");
        let place = BlobPlace::of(&source).unwrap();
        let want = BlobPlace {
            reference: "127.0.0.1:5000/lazy/zc:v1".into(),
            blob: "sha256:ab".into(),
            size: 12,
            media_type: "application/vnd.oci.image.layer.v1.tar+zstd".into(),
            insecure: true,
            no_tls_verify: false,
        };
        assert_eq!(place, want);
        let kept = serde_json::to_string(&place.source()).unwrap();
        let again: Source = serde_json::from_str(&kept).unwrap();
        assert_eq!(BlobPlace::of(&again).unwrap(), want);
        assert!(!kept.contains("format"), "{kept}");
        let missing = Source {
            name: "x".into(),
            place: serde_json::Map::new(),
        };
        assert!(BlobPlace::of(&missing).is_err(), "a place without its blob");
    }
}
