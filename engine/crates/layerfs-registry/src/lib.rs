//! Images from OCI registries into the layer store.
//!
//! The distribution protocol (manifests, indexes, platform choice, tokens,
//! blob digests) is `oci-client`'s; this crate decides what a pull means for
//! the store: which layers it already has (by `diff_id`), how a blob becomes
//! a layer (streamed, decompressed and unpacked in one pass, its `diff_id`
//! checked before the layer is kept), and how many download at once.
#![forbid(unsafe_code)]

mod auth;
mod blob;
mod crfs;
mod decompress;
mod error;
pub mod lazy;
mod manifest;
mod pull;
mod push;
mod reference;
mod session;

pub use auth::{credentials_for, login_file, store_credentials};
pub use blob::{write_layer_blob, BlobFormat, BlobInfo, LAYER_GZIP};
pub use error::{Error, ErrorKind};
pub use manifest::platform_matches;
pub use pull::{pull, LayerProgress, Pulled, PulledLayer};
pub use push::{push, Base, PushLayer, Pushed, Uploads};
pub use reference::normalize;

use std::path::PathBuf;

/// How to reach a registry.
#[derive(Clone, Debug, Default)]
pub struct Transport {
    /// Registries (`host[:port]`) reached over plain HTTP: only when asked.
    pub insecure: Vec<String>,
    /// Accept any certificate over HTTPS (`--tls-verify=false`).
    pub no_tls_verify: bool,
    /// A PEM file of extra certificate authorities to trust.
    pub ca_file: Option<PathBuf>,
}

/// What to pull.
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    /// `os/arch[/variant]`; the host's when `None`.
    pub platform: Option<String>,
    pub transport: Transport,
    /// Make a layer whose blob carries a table of contents (eStargz,
    /// zstd:chunked) from the table alone, its data to come later.
    pub lazy: bool,
}

/// The largest manifest or config accepted: far above any real one.
pub const MAX_MANIFEST: usize = 4 * 1024 * 1024;

/// Layers downloaded at once, as podman does.
pub const PARALLEL_LAYERS: usize = 3;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
