//! Lazy pull: a layer whose blob carries a table of contents (eStargz,
//! zstd:chunked) becomes a lazy layer in the store from the table alone;
//! its files' data comes from the registry when first read, or when the
//! daemon completes the layer.

use std::path::PathBuf;
use std::sync::Arc;

use layerfs_layers::lazy::{Fetch, Source};
use layerfs_layers::{LayerId, Store};
use oci_client::manifest::OciDescriptor;

use crate::session::Session;
use crate::{Error, Transport};

mod remote;
pub(crate) mod toc;

pub(crate) use toc::Format;
pub use toc::MAX_TOC;

/// What brings lazy layer data from `source`'s registry, reached as the
/// pull that made it was (plain HTTP, certificates), trusting the extra
/// authorities in `ca_file`, with the credentials stored for the registry.
pub fn fetcher(source: &Source, ca_file: Option<PathBuf>) -> Result<Arc<dyn Fetch>, Error> {
    let registry = crate::reference::parse(&source.reference)?
        .resolve_registry()
        .to_owned();
    let transport = Transport {
        insecure: if source.insecure {
            vec![registry]
        } else {
            Vec::new()
        },
        no_tls_verify: source.no_tls_verify,
        ca_file,
    };
    Ok(Arc::new(remote::Remote::open(source, &transport)?))
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
    let source = Source {
        reference: session.image.whole(),
        blob: blob.digest.clone(),
        size,
        media_type: blob.media_type.clone(),
        insecure: transport.insecure.contains(&session.registry),
        no_tls_verify: transport.no_tls_verify,
    };
    let remote = remote::Remote::open(&source, transport)?;
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
        .import_lazy(&entries, &source)
        .map_err(Error::unpacking)
}
