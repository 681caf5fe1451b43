//! The table of contents eStargz and zstd:chunked share: CRFS's JSON, as
//! stargz-snapshotter's `estargz` package and containers/storage write and
//! read it. One definition for the reader ([`crate::lazy`]) and the writer
//! (`blob/toc.rs`). A field at its zero value is left out, as both tools'
//! writers leave it (`omitempty`), and read as zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Toc {
    pub version: u32,
    pub entries: Vec<TocEntry>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct TocEntry {
    pub name: String,
    /// `dir`, `reg`, `chunk`, `symlink`, `hardlink`, `char`, `block`,
    /// `fifo`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub size: u64,
    /// RFC 3339.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modtime: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_name: Option<String>,
    #[serde(skip_serializing_if = "is_zero")]
    pub mode: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub uid: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub gid: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub dev_major: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub dev_minor: u32,
    /// Values in base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xattrs: Option<BTreeMap<String, String>>,
    /// The whole file's `sha256:<hex>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Where the file's (or chunk's) compressed data begins in the blob.
    #[serde(skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// Where a file's frames end (zstd:chunked, as containers/storage
    /// writes it).
    #[serde(skip_serializing_if = "is_zero")]
    pub end_offset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub chunk_offset: u64,
    /// Where the data begins in what the stream at `offset` decompresses
    /// to: eStargz packs small files into one gzip member this way.
    #[serde(skip_serializing_if = "is_zero")]
    pub inner_offset: u64,
    /// 0 for the rest of the file.
    #[serde(skip_serializing_if = "is_zero")]
    pub chunk_size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk_digest: Option<String>,
}

fn is_zero<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}
