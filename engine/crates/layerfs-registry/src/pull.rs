//! `pull`: an image's manifest and config, then each layer the store lacks,
//! [`PARALLEL_LAYERS`] at once.
//!
//! A layer's blob streams from the registry through a bounded channel to a
//! thread that decompresses and unpacks it into the store's staging area,
//! hashing the uncompressed tar on the way. `oci-client` checks the blob's
//! digest as the stream ends (a mismatch is an error on the last read); the
//! `diff_id` in the image's config is checked here. Only when both hold
//! does the layer move into `layers/`; any failure leaves nothing of it. A
//! pull cut short keeps the layers it finished, so the next pull fetches
//! only the rest; a layer cut short is fetched again from its start.

use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use layerfs_layers::{LayerId, Store};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::{Client, Reference};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::decompress::Compression;
use crate::session::Session;
use crate::{manifest, Error, ErrorKind, PullOptions, PARALLEL_LAYERS};

/// An image in the store.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// Its full reference (`docker.io/library/debian:latest`).
    pub reference: String,
    /// `registry/repository` it came from.
    pub repository: String,
    /// The digest of its manifest (the platform's, not the index's).
    pub digest: String,
    /// Its layers, bottom first.
    pub layers: Vec<PulledLayer>,
    /// How many of them were downloaded whole or made lazily (the rest the
    /// store had).
    pub fetched: usize,
    /// Its config, as the registry sent it: what a push of work over the
    /// image carries on (its command, environment, history).
    pub config: Vec<u8>,
    /// `os/arch[/variant]`, as its config says.
    pub platform: String,
}

#[derive(Clone, Debug)]
pub struct PulledLayer {
    /// The digest of the uncompressed tar, as the config names it.
    pub diff_id: String,
    /// The digest of the blob in the registry.
    pub blob: String,
    /// The blob's size in bytes.
    pub size: u64,
    pub media_type: String,
    pub layer: LayerId,
    /// Made by this pull from its table of contents: its data comes later.
    pub lazy: bool,
    /// Downloaded whole by this pull.
    pub downloaded: bool,
    /// The blob's descriptor's annotations.
    pub annotations: Vec<(String, String)>,
}

/// The part of an image config a pull reads.
#[derive(Deserialize)]
struct ImageConfig {
    rootfs: RootFs,
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    variant: Option<String>,
}

impl ImageConfig {
    /// `os/arch[/variant]`.
    fn platform(&self) -> String {
        match &self.variant {
            Some(v) if !v.is_empty() => format!("{}/{}/{v}", self.os, self.architecture),
            _ => format!("{}/{}", self.os, self.architecture),
        }
    }
}

#[derive(Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// How far the download of one layer has got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerProgress {
    /// The digest of its blob.
    pub digest: String,
    /// Bytes downloaded of `total`.
    pub done: u64,
    pub total: u64,
}

/// Pulls `reference` into `store`. `have` answers which layer of the store
/// holds a `diff_id` already; `progress` is told how far each layer to
/// download has got, a few times a second.
pub fn pull(
    store: &Store,
    reference: &str,
    options: &PullOptions,
    have: &(dyn Fn(&str) -> Option<LayerId> + Sync),
    progress: &mut dyn FnMut(&[LayerProgress]),
) -> Result<Pulled, Error> {
    let session = Session::open(reference, &options.transport)?;
    let choose = manifest::chooser(options.platform.as_deref())?;
    let manifest::Fetched {
        manifest,
        digest,
        config,
    } = session.block_on(manifest::fetch(
        &session,
        &choose,
        options.platform.as_deref(),
    ))?;
    let raw_config = config;
    let config: ImageConfig = serde_json::from_slice(&raw_config).map_err(|e| {
        Error::new(
            ErrorKind::Registry,
            format!("its config cannot be read: {e}"),
        )
    })?;
    let platform = config.platform();
    let diff_ids = config.rootfs.diff_ids;
    check_manifest(&manifest, &diff_ids)?;

    let mut layers: Vec<Option<LayerId>> = diff_ids.iter().map(|d| have(d)).collect();
    // Layers with a table of contents are made from it alone, first.
    let mut lazy = vec![false; layers.len()];
    if options.lazy {
        for (i, blob) in manifest.layers.iter().enumerate() {
            if layers[i].is_some() {
                continue;
            }
            if let Some(format) = crate::lazy::Format::of(blob)? {
                let layer = crate::lazy::import(store, &session, &options.transport, blob, &format)
                    .map_err(|e| e.of(format_args!("layer {}", blob.digest)))?;
                // The same tree may be here already, whole (pulled whole
                // or committed here): then it is not lazy.
                lazy[i] = store.is_lazy(&layer);
                layers[i] = Some(layer);
            }
        }
    }
    let wanted: Vec<usize> = (0..layers.len()).filter(|&i| layers[i].is_none()).collect();
    let done: Vec<AtomicU64> = wanted.iter().map(|_| AtomicU64::new(0)).collect();
    let report = |progress: &mut dyn FnMut(&[LayerProgress])| {
        let now: Vec<LayerProgress> = wanted
            .iter()
            .zip(&done)
            .map(|(&i, done)| LayerProgress {
                digest: manifest.layers[i].digest.clone(),
                done: done.load(Relaxed),
                total: manifest.layers[i].size.max(0) as u64,
            })
            .collect();
        progress(&now);
    };
    let fetched = std::thread::scope(|threads| {
        session.block_on(async {
            let downloads = futures_util::stream::iter(wanted.iter().copied().zip(&done))
                .map(|(i, done)| {
                    let (client, image) = (&session.client, &session.image);
                    let (descriptor, diff_id) = (&manifest.layers[i], &diff_ids[i]);
                    async move {
                        let layer =
                            fetch_layer(threads, store, client, image, descriptor, diff_id, done)
                                .await;
                        (i, layer)
                    }
                })
                .buffer_unordered(PARALLEL_LAYERS)
                .collect::<Vec<_>>();
            tokio::pin!(downloads);
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    finished = &mut downloads => break finished,
                    _ = tick.tick() => report(progress),
                }
            }
        })
    });
    report(progress);
    for (i, layer) in fetched {
        let layer = layer.map_err(|e| e.of(format_args!("layer {}", manifest.layers[i].digest)))?;
        layers[i] = Some(layer);
    }
    Ok(Pulled {
        reference: session.image.whole(),
        repository: crate::session::repository_of(&session.image),
        digest,
        fetched: wanted.len() + lazy.iter().filter(|&&l| l).count(),
        config: raw_config,
        platform,
        layers: layers
            .into_iter()
            .zip(&manifest.layers)
            .zip(diff_ids)
            .zip(lazy)
            .enumerate()
            .map(|(i, (((layer, blob), diff_id), lazy))| PulledLayer {
                lazy,
                downloaded: wanted.contains(&i),
                annotations: blob
                    .annotations
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                diff_id,
                blob: blob.digest.clone(),
                size: blob.size.max(0) as u64,
                media_type: blob.media_type.clone(),
                layer: layer.expect("every layer was had or fetched"),
            })
            .collect(),
    })
}

/// A manifest the store can use: one `diff_id` per layer, each layer of a
/// media type this pull can unpack.
fn check_manifest(manifest: &OciImageManifest, diff_ids: &[String]) -> Result<(), Error> {
    if manifest.layers.len() != diff_ids.len() {
        return Err(Error::new(
            ErrorKind::Registry,
            format!(
                "its manifest has {} layers and its config {} diff_ids",
                manifest.layers.len(),
                diff_ids.len()
            ),
        ));
    }
    for layer in &manifest.layers {
        Compression::of(&layer.media_type)
            .map_err(|e| e.of(format_args!("layer {}", layer.digest)))?;
    }
    Ok(())
}

/// Downloads one layer into the store: the blob streams to a thread that
/// unpacks it, through a channel of a few chunks so memory stays bounded.
async fn fetch_layer<'scope>(
    threads: &'scope std::thread::Scope<'scope, '_>,
    store: &'scope Store,
    client: &Client,
    image: &Reference,
    descriptor: &OciDescriptor,
    diff_id: &'scope str,
    done: &AtomicU64,
) -> Result<LayerId, Error> {
    let compression = Compression::of(&descriptor.media_type)?;
    // A lazy format's metadata is no file of the layer, pulled lazily or not.
    let leave_out: &[&str] = match crate::lazy::Format::of(descriptor)? {
        Some(_) => &crate::lazy::toc::METADATA,
        None => &[],
    };
    let mut stream = client
        .pull_blob_stream(image, descriptor)
        .await
        .map_err(|e| Error::new(ErrorKind::Registry, e.to_string()))?
        .stream;
    let (chunks, received) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(16);
    let (result_tx, result_rx) = tokio::sync::oneshot::channel();
    threads.spawn(move || {
        let blob = Chunks {
            received,
            current: Default::default(),
        };
        let _ = result_tx.send(unpack_layer(store, blob, compression, diff_id, leave_out));
    });
    loop {
        let chunk = stream.try_next().await;
        let end = matches!(chunk, Ok(None) | Err(_));
        let item = match chunk {
            Ok(Some(bytes)) => {
                done.fetch_add(bytes.len() as u64, Relaxed);
                Ok(bytes)
            }
            Ok(None) => break,
            Err(e) => Err(e),
        };
        // The unpacker stopped (it failed): its reason is the answer.
        if chunks.send(item).await.is_err() || end {
            break;
        }
    }
    drop(chunks);
    result_rx
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Store,
                "the unpacking thread ended without an answer",
            )
        })?
        .map_err(Error::unpacking)
}

/// Decompresses and unpacks `blob`, then checks the uncompressed bytes
/// against `diff_id` and reads the blob to its end, where the client checks
/// its digest, before the store keeps the layer.
fn unpack_layer(
    store: &Store,
    mut blob: Chunks,
    compression: Compression,
    diff_id: &str,
    leave_out: &[&str],
) -> io::Result<LayerId> {
    let imported = store.import_tar_checked(leave_out, |unpack| {
        unpack_checked(unpack, &mut blob, compression, diff_id)
    });
    // Bytes that are not the blob's make a damaged archive first; the rest
    // of the blob says whether that is the reason.
    if imported.is_err() {
        if let Err(e) = io::copy(&mut blob, &mut io::sink()) {
            if is_digest_mismatch(&e) {
                return Err(not_its_digest());
            }
        }
    }
    imported
}

fn unpack_checked(
    unpack: layerfs_layers::Unpack<'_>,
    blob: &mut Chunks,
    compression: Compression,
    diff_id: &str,
) -> io::Result<()> {
    let actual = {
        let decoded = compression.decoder(&mut *blob);
        let mut tar = Hashed {
            inner: decoded,
            hash: Sha256::new(),
        };
        unpack(&mut tar)?;
        // The archive's end blocks and padding count in the diff_id.
        io::copy(&mut tar, &mut io::sink())?;
        format!("sha256:{}", crate::hex(&tar.hash.finalize()))
    };
    // The rest of the blob, to its end, where its digest is checked.
    io::copy(blob, &mut io::sink()).map_err(|e| match is_digest_mismatch(&e) {
        true => not_its_digest(),
        false => e,
    })?;
    if actual != diff_id {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "its uncompressed content is {actual}, not the diff_id {diff_id} its image names"
            ),
        ));
    }
    Ok(())
}

fn not_its_digest() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "the blob does not match its digest",
    )
}

/// Whether the client's stream ended with a digest mismatch.
fn is_digest_mismatch(e: &io::Error) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("digest")
        && (text.contains("verif") || text.contains("mismatch") || text.contains("expected"))
}

/// A reader of the chunks a download sends.
struct Chunks {
    received: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.received.blocking_recv() {
                None => return Ok(0),
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(e)) => {
                    let why = format!("the download broke off: {e}");
                    return Err(io::Error::new(e.kind(), why));
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// A reader that hashes what is read through it.
struct Hashed<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
