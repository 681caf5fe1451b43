//! `push`: layers of the store as an OCI image in a registry.
//!
//! For each layer, a blob the registry already has is used as it is: the
//! one it was pulled as, or the one an earlier push made (the store
//! remembers both). Only a layer with neither is written as a blob (in the
//! store's staging area, deterministically: see [`crate::blob`]) and
//! uploaded, streamed from the file. Then the config (the base image's
//! where the layers are an image's and more, its `diff_ids`, and a history
//! entry per layer past the base's with its commit message) and the
//! manifest.

use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use oci_client::client::Client;
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use oci_client::{Reference, RegistryOperation};
use sha2::{Digest, Sha256};

use crate::blob::{write_layer_blob, BlobFormat, BlobInfo};
use crate::session::{host_arch, repository_of, Session};
use crate::{Error, ErrorKind, Transport};

/// A layer to push: where it is, the blobs it is known by, and what its
/// history entry says.
pub struct PushLayer {
    pub dir: PathBuf,
    pub known: Vec<BlobInfo>,
    pub comment: Option<String>,
}

/// What a push did.
#[derive(Clone, Debug)]
pub struct Pushed {
    pub reference: String,
    /// The digest of the manifest.
    pub digest: String,
    /// The blob of each layer, bottom first, and whether it was uploaded.
    pub layers: Vec<(BlobInfo, bool)>,
}

/// How a push writes the blobs of the layers the registry lacks.
pub struct Uploads<'a> {
    pub format: BlobFormat,
    /// Where blobs are made before they are sent.
    pub staging: &'a Path,
    /// Brings in all of layer `i`'s files before they are read (a lazy
    /// layer's): a layer whose blob the registry has already is not read,
    /// so not asked for.
    pub make_whole: &'a mut dyn FnMut(usize) -> std::io::Result<()>,
}

/// Pushes `layers` (bottom first) as the image `reference`, over `base`
/// where they are an image's layers and more; blobs the registry lacks are
/// made as `uploads` says. `progress` is told (layers done, layers).
pub fn push(
    reference: &str,
    layers: &[PushLayer],
    base: Option<&Base>,
    uploads: Uploads<'_>,
    transport: &Transport,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Pushed, Error> {
    let Uploads {
        format,
        staging,
        make_whole,
    } = uploads;
    let session = Session::open(reference, transport)?;
    let Session {
        client,
        image,
        auth,
        ..
    } = &session;
    let failed = |e| session.failed(e);
    session
        .block_on(client.auth(image, auth, RegistryOperation::Push))
        .map_err(failed)?;
    let mut pushed = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        progress(i as u64, layers.len() as u64);
        // Only a blob of the format asked is taken as it is.
        let known: Vec<BlobInfo> = layer
            .known
            .iter()
            .filter(|b| format.is_of(b))
            .cloned()
            .collect();
        let found = session
            .block_on(already_there(client, image, &known))
            .map_err(failed)?;
        let entry = match found {
            Some(blob) => (blob, false),
            None => {
                make_whole(i).map_err(|e| {
                    Error::new(
                        ErrorKind::Store,
                        format!("cannot bring in {}: {e}", layer.dir.display()),
                    )
                })?;
                (upload_layer(&session, &layer.dir, format, staging)?, true)
            }
        };
        pushed.push((
            BlobInfo {
                repository: Some(repository_of(image)),
                ..entry.0
            },
            entry.1,
        ));
    }
    let config = image_config(&pushed, layers, base)?;
    let config_digest = format!("sha256:{}", crate::hex(&Sha256::digest(&config)));
    let config_size = config.len() as i64;
    session
        .block_on(client.push_blob(image, config, &config_digest))
        .map_err(failed)?;
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(oci_client::manifest::OCI_IMAGE_MEDIA_TYPE.to_owned()),
        config: OciDescriptor {
            media_type: oci_client::manifest::IMAGE_CONFIG_MEDIA_TYPE.to_owned(),
            digest: config_digest,
            size: config_size,
            ..OciDescriptor::default()
        },
        layers: pushed
            .iter()
            .map(|(blob, _)| OciDescriptor {
                media_type: blob.media_type.clone(),
                digest: blob.digest.clone(),
                size: blob.size as i64,
                annotations: (!blob.annotations.is_empty())
                    .then(|| blob.annotations.iter().cloned().collect()),
                ..OciDescriptor::default()
            })
            .collect(),
        ..OciImageManifest::default()
    };
    let manifest = OciManifest::Image(manifest);
    let bytes = serde_json::to_vec(&manifest).expect("a manifest serialises");
    let digest = format!("sha256:{}", crate::hex(&Sha256::digest(&bytes)));
    session
        .block_on(client.push_manifest_raw(
            image,
            bytes::Bytes::from(bytes),
            http::HeaderValue::from_static(oci_client::manifest::OCI_IMAGE_MEDIA_TYPE),
        ))
        .map_err(failed)?;
    progress(layers.len() as u64, layers.len() as u64);
    Ok(Pushed {
        reference: image.whole(),
        digest,
        layers: pushed,
    })
}

/// One of `known` the repository of `image` has, or can mount from another
/// repository of its registry without an upload.
async fn already_there(
    client: &Client,
    image: &Reference,
    known: &[BlobInfo],
) -> oci_client::errors::Result<Option<BlobInfo>> {
    for blob in known {
        if client.blob_exists(image, &blob.digest).await? {
            return Ok(Some(blob.clone()));
        }
    }
    let registry = image.resolve_registry();
    for blob in known {
        let Some(from) = &blob.repository else {
            continue;
        };
        let Some(repository) = from
            .strip_prefix(registry)
            .and_then(|r| r.strip_prefix('/'))
        else {
            continue;
        };
        let source = Reference::with_tag(
            registry.to_owned(),
            repository.to_owned(),
            "latest".to_owned(),
        );
        // A registry that cannot mount it says so; then it is uploaded.
        if client
            .mount_blob(image, &source, &blob.digest)
            .await
            .is_ok()
        {
            return Ok(Some(blob.clone()));
        }
    }
    Ok(None)
}

/// Writes the layer at `dir` as a blob in `staging` and uploads it,
/// streamed from the file; the file is removed either way.
fn upload_layer(
    session: &Session,
    dir: &Path,
    format: BlobFormat,
    staging: &Path,
) -> Result<BlobInfo, Error> {
    let file = staging.join(format!(
        "blob-{}-{}",
        std::process::id(),
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let result = (|| {
        let store_error = |e: std::io::Error| {
            let kind = match e.kind() {
                std::io::ErrorKind::StorageFull => ErrorKind::NoSpace,
                _ => ErrorKind::Store,
            };
            Error::new(
                kind,
                format!("cannot make the blob of {}: {e}", dir.display()),
            )
        };
        let blob = write_layer_blob(dir, &file, format).map_err(store_error)?;
        let opened = std::fs::File::open(&file).map_err(store_error)?;
        let chunks = futures_util::stream::unfold(opened, |mut f| async move {
            use std::io::Read;
            let mut buf = vec![0; 1 << 20];
            match f.read(&mut buf) {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), f))
                }
                Err(e) => Some((Err(oci_client::errors::OciDistributionError::IoError(e)), f)),
            }
        })
        .boxed();
        let upload =
            session
                .client
                .push_blob_stream(&session.image, chunks, &blob.digest, Some(blob.size));
        session.block_on(upload).map_err(|e| session.failed(e))?;
        Ok(blob)
    })();
    let _ = std::fs::remove_file(&file);
    result
}

/// The image a push builds on: its config, and how many of the layers
/// pushed (the first ones) are its own.
#[derive(Clone, Debug)]
pub struct Base {
    pub config: Vec<u8>,
    pub layers: usize,
}

/// The image config: the base's (its command, environment, user, working
/// directory, labels, platform and history), as `podman commit` carries it,
/// else an empty one for the host's platform; then the layers' `diff_ids`,
/// and a history entry for each layer past the base's.
fn image_config(
    pushed: &[(BlobInfo, bool)],
    layers: &[PushLayer],
    base: Option<&Base>,
) -> Result<Vec<u8>, Error> {
    use serde_json::{json, Map, Value};
    let entry = |l: &PushLayer| match &l.comment {
        Some(c) => json!({ "created_by": "layerfs", "comment": c }),
        None => json!({ "created_by": "layerfs" }),
    };
    let (mut config, mut history, from) = match base {
        Some(base) => {
            let Ok(Value::Object(mut config)) = serde_json::from_slice(&base.config) else {
                return Err(Error::invalid("the base image's config cannot be read"));
            };
            let history = match config.remove("history") {
                Some(Value::Array(h)) => h,
                _ => Vec::new(),
            };
            let counted = history
                .iter()
                .filter(|h| h.get("empty_layer") != Some(&Value::Bool(true)))
                .count();
            // A history that does not match the layers is no history of
            // them: each gets an entry of its own.
            let history = if counted == base.layers {
                history
            } else {
                layers[..base.layers].iter().map(entry).collect()
            };
            // The base's time is not this image's.
            config.remove("created");
            (config, history, base.layers)
        }
        None => {
            let mut config = Map::new();
            config.insert("architecture".into(), host_arch().into());
            config.insert("os".into(), "linux".into());
            config.insert("config".into(), json!({}));
            (config, Vec::new(), 0)
        }
    };
    history.extend(layers[from..].iter().map(entry));
    let diff_ids: Vec<&str> = pushed.iter().map(|(b, _)| b.diff_id.as_str()).collect();
    config.insert(
        "rootfs".into(),
        json!({ "type": "layers", "diff_ids": diff_ids }),
    );
    config.insert("history".into(), Value::Array(history));
    Ok(serde_json::to_vec(&config).expect("a JSON value serialises"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn layer(comment: Option<&str>) -> PushLayer {
        PushLayer {
            dir: PathBuf::new(),
            known: Vec::new(),
            comment: comment.map(str::to_owned),
        }
    }

    fn blob(diff_id: &str) -> (BlobInfo, bool) {
        let info = BlobInfo {
            digest: String::new(),
            size: 0,
            media_type: String::new(),
            diff_id: diff_id.into(),
            repository: None,
            annotations: Vec::new(),
        };
        (info, false)
    }

    #[test]
    fn a_push_over_an_image_carries_its_config_and_appends_to_its_history() {
        let base = serde_json::json!({
            "architecture": "arm64", "os": "linux", "variant": "v8",
            "created": "2020-01-01T00:00:00Z",
            "config": { "Entrypoint": ["/bin/app"], "Cmd": ["--serve"], "Env": ["A=1"],
                        "WorkingDir": "/srv", "User": "app" },
            "rootfs": { "type": "layers", "diff_ids": ["sha256:a"] },
            "history": [ { "created_by": "ENV A=1", "empty_layer": true },
                         { "created_by": "COPY app" } ],
        });
        let base = Base {
            config: serde_json::to_vec(&base).unwrap(),
            layers: 1,
        };
        let layers = [layer(None), layer(Some("my work"))];
        let pushed = [blob("sha256:a"), blob("sha256:b")];
        let config: Value =
            serde_json::from_slice(&image_config(&pushed, &layers, Some(&base)).unwrap()).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/bin/app");
        assert_eq!(config["config"]["WorkingDir"], "/srv");
        assert_eq!(config["config"]["User"], "app");
        assert_eq!(
            (&config["architecture"], &config["variant"]),
            (&"arm64".into(), &"v8".into())
        );
        assert_eq!(
            config["rootfs"]["diff_ids"],
            serde_json::json!(["sha256:a", "sha256:b"])
        );
        let history = config["history"].as_array().unwrap();
        assert_eq!(history.len(), 3);
        assert_eq!(history[1]["created_by"], "COPY app");
        assert_eq!(history[2]["comment"], "my work");
        assert!(
            config.get("created").is_none(),
            "the base's time is not the new image's"
        );
    }

    #[test]
    fn a_push_of_layers_alone_has_an_empty_config_and_an_entry_per_layer() {
        let layers = [layer(Some("first")), layer(None)];
        let pushed = [blob("sha256:a"), blob("sha256:b")];
        let config: Value =
            serde_json::from_slice(&image_config(&pushed, &layers, None).unwrap()).unwrap();
        assert_eq!(config["config"], serde_json::json!({}));
        assert_eq!(config["os"], "linux");
        assert_eq!(config["history"].as_array().unwrap().len(), 2);
        assert_eq!(config["history"][0]["comment"], "first");
        // A base whose history does not count its layers: an entry each.
        let base = Base {
            config:
                br#"{"os":"linux","architecture":"amd64","config":{"Cmd":["sh"]},"history":[]}"#
                    .to_vec(),
            layers: 1,
        };
        let config: Value =
            serde_json::from_slice(&image_config(&pushed, &layers, Some(&base)).unwrap()).unwrap();
        assert_eq!(config["config"]["Cmd"][0], "sh");
        assert_eq!(config["history"].as_array().unwrap().len(), 2);
        let bad = Base {
            config: b"[]".to_vec(),
            layers: 0,
        };
        assert!(image_config(&pushed, &layers, Some(&bad)).is_err());
    }
}
