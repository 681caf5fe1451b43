//! A lazy layer's pieces from its blob in the registry: single-range GETs,
//! neighbours coalesced, each piece decompressed on its own.
//!
//! Never a multi-range request: some registries answer one with 400, 501
//! or the whole blob. `oci-client` does not check a partial answer against
//! the blob's digest (it cannot): the layer checks every piece against its
//! digest in the table of contents before a byte of it is used or kept
//! ([`layerfs_layers::lazy`]).

use std::io;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use layerfs_layers::lazy::{Fetch, Piece};

use super::BlobPlace;
use oci_client::client::BlobResponse;
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciDescriptor;
use oci_client::RegistryOperation;

use crate::decompress::Compression;
use crate::session::Session;
use crate::{Error, ErrorKind, Transport};

/// Pieces closer than this in the blob come in one request: fewer round
/// trips for a few bytes more.
const GAP: u64 = 256 * 1024;

/// How long a read waits for a registry that does not answer, unless
/// `LAYERFS_LAZY_WAIT` (seconds) says otherwise.
const WAIT: Duration = Duration::from_secs(30);

/// The least time a request is given, the last one at the deadline too.
const LAST_TRY: Duration = Duration::from_secs(1);

/// How long after a read gave up on the registry another read asks it once
/// and does not wait: the kernel follows a failed READ with more (its
/// read-ahead, then the page alone), which would each wait again.
const JUST_GAVE_UP: Duration = Duration::from_secs(2);

/// A lazy layer's blob in its registry.
pub(crate) struct Remote {
    session: Session,
    blob: OciDescriptor,
    compression: Compression,
    wait: Duration,
    /// When a read last gave up on the registry.
    gave_up: Mutex<Option<Instant>>,
}

impl Remote {
    pub(crate) fn open(source: &BlobPlace, transport: &Transport) -> Result<Remote, Error> {
        let session = Session::open(&source.reference, transport)?;
        let blob = OciDescriptor {
            media_type: source.media_type.clone(),
            digest: source.blob.clone(),
            size: source.size as i64,
            ..Default::default()
        };
        let wait = std::env::var("LAYERFS_LAZY_WAIT")
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(WAIT, Duration::from_secs);
        Ok(Remote {
            compression: Compression::of(&source.media_type)?,
            session,
            blob,
            wait,
            gave_up: Mutex::new(None),
        })
    }

    /// Bytes `start..end` of the blob, asked again (a token renewed, a
    /// registry away) until the wait runs out.
    pub(crate) fn range(&self, start: u64, end: u64) -> Result<Vec<u8>, Error> {
        let gave_up = *self.gave_up.lock().unwrap_or_else(PoisonError::into_inner);
        let got = self.asking_until(
            start,
            end,
            match gave_up {
                Some(at) if at.elapsed() < JUST_GAVE_UP => Instant::now(),
                _ => Instant::now() + self.wait,
            },
        );
        *self.gave_up.lock().unwrap_or_else(PoisonError::into_inner) =
            got.is_err().then(Instant::now);
        got
    }

    /// Bytes `start..end` of the blob, asked until `deadline` (at least once).
    fn asking_until(&self, start: u64, end: u64, deadline: Instant) -> Result<Vec<u8>, Error> {
        let mut pause = Duration::from_millis(100);
        // A token is asked for at most once between two pauses: a registry
        // that refuses the one it just issued is not asked in a tight loop.
        let mut renewed = false;
        loop {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(LAST_TRY);
            let tried = self
                .session
                .block_on(async { tokio::time::timeout(left, self.get(start, end)).await });
            let failed = match tried {
                Ok(Ok(bytes)) => return Ok(bytes),
                Ok(Err(Got::Expired)) if renewed => Error::new(
                    ErrorKind::Unauthorized,
                    format!(
                        "{}: refuses the token it just issued",
                        self.session.registry
                    ),
                ),
                Ok(Err(Got::Expired)) => {
                    // A bearer token that ran out: a new one, without the user.
                    renewed = true;
                    let asked = self.session.block_on(self.session.client.auth(
                        &self.session.image,
                        &self.session.auth,
                        RegistryOperation::Pull,
                    ));
                    match asked {
                        Ok(_) => continue,
                        Err(e) => self.session.failed(e),
                    }
                }
                Ok(Err(Got::Failed(e))) => e,
                Err(_) => Error::new(
                    ErrorKind::Registry,
                    format!(
                        "{}: no answer in {} s",
                        self.session.registry,
                        self.wait.as_secs()
                    ),
                ),
            };
            // Asked last at the deadline: a read fails after the whole wait,
            // not a pause before it.
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(failed);
            }
            tracing::warn!(registry = %self.session.registry, error = %failed, "a lazy read waits for the registry");
            std::thread::sleep(pause.min(left));
            renewed = false;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    async fn get(&self, start: u64, end: u64) -> Result<Vec<u8>, Got> {
        let Session {
            client,
            image,
            auth,
            ..
        } = &self.session;
        let len = end - start;
        let answer = match client
            .pull_blob_stream_partial(image, &self.blob, start, Some(len))
            .await
        {
            Err(E::AuthenticationFailure(_) | E::UnauthorizedError { .. }) => {
                return Err(Got::Expired)
            }
            Err(e) => {
                // The first request of a session carries no token yet.
                client
                    .store_auth_if_needed(image.resolve_registry(), auth)
                    .await;
                return Err(Got::Failed(self.session.failed(e)));
            }
            Ok(answer) => answer,
        };
        // A registry that ignores Range sends the whole blob: what is asked
        // is cut out of it.
        let (mut stream, skip) = match answer {
            BlobResponse::Partial(s) => (s.stream, 0),
            BlobResponse::Full(s) => (s.stream, start),
        };
        let mut bytes = Vec::with_capacity(len.min(64 << 20) as usize);
        let mut skipped = 0;
        while let Some(chunk) = stream.try_next().await.map_err(|e| {
            Got::Failed(Error::new(
                ErrorKind::Registry,
                format!("the download broke off: {e}"),
            ))
        })? {
            let mut chunk = &chunk[..];
            if skipped < skip {
                let n = (skip - skipped).min(chunk.len() as u64) as usize;
                skipped += n as u64;
                chunk = &chunk[n..];
            }
            let room = (len - bytes.len() as u64).min(chunk.len() as u64) as usize;
            bytes.extend_from_slice(&chunk[..room]);
            if bytes.len() as u64 == len {
                break;
            }
        }
        if (bytes.len() as u64) < len {
            return Err(Got::Failed(Error::new(
                ErrorKind::Registry,
                format!("the registry sent {} of the {len} bytes asked", bytes.len()),
            )));
        }
        Ok(bytes)
    }
}

use OciDistributionError as E;

enum Got {
    /// The registry wants a new token.
    Expired,
    Failed(Error),
}

impl Fetch for Remote {
    fn fetch(&self, pieces: &[&Piece]) -> io::Result<Vec<Vec<u8>>> {
        let mut order: Vec<usize> = (0..pieces.len()).collect();
        order.sort_by_key(|&i| pieces[i].start);
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); pieces.len()];
        let mut at = 0;
        while at < order.len() {
            let start = pieces[order[at]].start;
            let mut end = pieces[order[at]].end;
            let mut to = at + 1;
            while to < order.len() && pieces[order[to]].start <= end + GAP {
                end = end.max(pieces[order[to]].end);
                to += 1;
            }
            let bytes = self
                .range(start, end)
                .map_err(|e| io::Error::other(e.to_string()))?;
            for &i in &order[at..to] {
                let piece = pieces[i];
                let slice = &bytes[(piece.start - start) as usize..(piece.end - start) as usize];
                // One that cannot be decompressed is handed on empty, and
                // fails its check like any damaged one.
                out[i] = self.compression.piece(slice, piece).unwrap_or_else(|e| {
                    tracing::warn!(blob = %self.blob.digest, at = piece.start, "a piece cannot be decompressed: {e}");
                    Vec::new()
                });
            }
            at = to;
        }
        Ok(out)
    }
}
