//! Images from registries: pull, push, list, remove, and resolving an
//! image reference given to `create --from`.

use layerfs_layers::LayerId;
use layerfs_registry::{BlobInfo, PullOptions, PushLayer, Transport};

use super::{failed, in_use, invalid, not_found, now, Daemon, Outcome};
use crate::catalog::ImageRecord;
use crate::protocol::{
    ControlError, ErrorKind, ImageInfo, PartProgress, Progress, PushInfo, RegistryOptions,
};

impl Daemon {
    /// Pulls `reference`. Only the layers the store lacks are downloaded,
    /// each under no lock while it streams; the store's layer lock is taken
    /// to record the image, so a `layer rm` never races it.
    pub(super) fn pull(
        &self,
        reference: &str,
        registry: &RegistryOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Outcome<ImageInfo> {
        let options = PullOptions {
            platform: registry.platform.clone(),
            transport: self.transport(registry),
            lazy: !registry.whole,
        };
        let have = |diff_id: &str| -> Option<LayerId> {
            let layer = self.catalog.layer_of_diff_id(diff_id).ok()??;
            self.store.layer(&layer)
        };
        let pulled =
            layerfs_registry::pull(&self.store, reference, &options, &have, &mut |layers| {
                progress(Progress {
                    done: layers.iter().map(|l| l.done).sum(),
                    total: layers.iter().map(|l| l.total).sum(),
                    parts: layers
                        .iter()
                        .map(|l| PartProgress {
                            name: l.digest.clone(),
                            done: l.done,
                            total: l.total,
                        })
                        .collect(),
                })
            })
            .map_err(|e| registry_error(format_args!("cannot pull {reference}"), e))?;
        let record = ImageRecord {
            digest: pulled.digest.clone(),
            layers: pulled.layers.iter().map(|l| l.layer.to_string()).collect(),
            blobs: pulled.layers.iter().map(|l| l.blob.clone()).collect(),
            diff_ids: pulled.layers.iter().map(|l| l.diff_id.clone()).collect(),
            size: pulled.layers.iter().map(|l| l.size).sum(),
            created: now(),
            platform: pulled.platform.clone(),
            config: String::from_utf8(pulled.config.clone()).ok(),
        };
        for l in &pulled.layers {
            let blob = BlobInfo {
                digest: l.blob.clone(),
                size: l.size,
                media_type: l.media_type.clone(),
                diff_id: l.diff_id.clone(),
                repository: Some(pulled.repository.clone()),
                annotations: l.annotations.clone(),
            };
            self.catalog.add_layer_blob(l.layer.as_str(), &blob)?;
        }
        for l in pulled.layers.iter().filter(|l| l.lazy) {
            self.attach_lazy(&l.layer)?;
        }
        let layers: Vec<LayerId> = pulled.layers.iter().map(|l| l.layer.clone()).collect();
        self.set_on_read(&layers, registry.on_read)?;
        if registry.complete {
            self.complete_layers(&layers)?;
        }
        let _layers = self.layer_changes.lock();
        // A layer removed while the pull ran is not in the image.
        if let Some(gone) = record.layers.iter().find(|l| self.store.layer(l).is_none()) {
            return Err(failed(format!(
                "cannot pull {reference}: layer {gone} was removed meanwhile: pull again"
            )));
        }
        self.catalog.put_image(&pulled.reference, &record)?;
        let mut info = self.image_info(&pulled.reference, &record, pulled.fetched);
        if options.lazy {
            info.whole = pulled
                .layers
                .iter()
                .filter(|l| l.downloaded)
                .map(|l| l.blob.clone())
                .collect();
        }
        Ok(info)
    }

    /// Pushes `sources` (workspaces with no changes of their own, and
    /// layers, bottom first) as the image `reference`.
    pub(super) fn push(
        &self,
        sources: &[String],
        reference: &str,
        registry: &RegistryOptions,
        layer_format: Option<&str>,
        progress: &mut dyn FnMut(Progress),
    ) -> Outcome<PushInfo> {
        if sources.is_empty() {
            return Err(invalid("nothing to push: name a workspace or layers"));
        }
        let mut layers = Vec::new();
        let mut image = None;
        for (i, source) in sources.iter().enumerate() {
            match self.catalog.workspace(source)? {
                Some(record) => {
                    if i == 0 {
                        image = record.image.clone();
                    }
                    let changes = self.diff(source)?;
                    if !changes.is_empty() {
                        return Err(in_use(format!(
                            "workspace {source} has {} changes not committed: `layerfs commit {source}` first",
                            changes.len()
                        )));
                    }
                    for id in &record.layers {
                        layers.push(self.find_layer(id)?);
                    }
                }
                None => layers.push(self.find_layer(source)?),
            }
        }
        let mut to_push = Vec::new();
        for layer in &layers {
            to_push.push(PushLayer {
                dir: self.store.layer_dir(layer),
                known: self.catalog.layer_blobs(layer.as_str())?,
                comment: self.catalog.note(layer.as_str())?.message,
            });
        }
        let base = self.base_of(&layers, image.as_deref())?;
        let transport = self.transport(registry);
        let staging = self.root.join("staging");
        let format = match layer_format {
            None => layerfs_registry::BlobFormat::default(),
            Some(name) => name
                .parse()
                .map_err(|e: layerfs_registry::Error| invalid(e.message))?,
        };
        // A layer uploaded is read whole: a lazy one is completed first. One
        // the registry has already is mounted or reused, and stays lazy.
        let mut make_whole = |i: usize| {
            self.complete_layers(&layers[i..=i])
                .map_err(|e| std::io::Error::other(e.message))
        };
        let uploads = layerfs_registry::Uploads {
            format,
            staging: &staging,
            make_whole: &mut make_whole,
        };
        let pushed = layerfs_registry::push(
            reference,
            &to_push,
            base.as_ref(),
            uploads,
            &transport,
            &mut |done, total| progress(Progress::of(done, total)),
        )
        .map_err(|e| registry_error(format_args!("cannot push {reference}"), e))?;
        for (layer, (blob, _)) in layers.iter().zip(&pushed.layers) {
            self.catalog.add_layer_blob(layer.as_str(), blob)?;
        }
        Ok(PushInfo {
            reference: pushed.reference,
            digest: pushed.digest,
            layers: pushed.layers.len(),
            uploaded: pushed.layers.iter().filter(|(_, up)| *up).count(),
        })
    }

    /// The image `layers` (bottom first) build on, with its config: the
    /// workspace's own `image` where its layers begin them; else, of the
    /// images whose layers begin them, the one with the most layers (of
    /// those, the last pulled). None where no image's do, or its config was
    /// not recorded.
    fn base_of(
        &self,
        layers: &[LayerId],
        image: Option<&str>,
    ) -> Outcome<Option<layerfs_registry::Base>> {
        let images = self.catalog.images()?;
        let begins = |image: &ImageRecord| {
            image.layers.len() <= layers.len()
                && image
                    .layers
                    .iter()
                    .zip(layers)
                    .all(|(a, b)| a == b.as_str())
        };
        let own = images
            .iter()
            .find(|(reference, record)| Some(reference.as_str()) == image && begins(record));
        let longest = || {
            images
                .iter()
                .filter(|(_, image)| !image.layers.is_empty() && begins(image))
                .max_by_key(|(_, image)| (image.layers.len(), image.created))
        };
        Ok(own.or_else(longest).cloned().and_then(|(_, image)| {
            Some(layerfs_registry::Base {
                config: image.config?.into_bytes(),
                layers: image.layers.len(),
            })
        }))
    }

    /// How to reach registries, from a request's options.
    fn transport(&self, registry: &RegistryOptions) -> Transport {
        Transport {
            insecure: registry.insecure.clone(),
            no_tls_verify: registry.no_tls_verify,
            ca_file: std::env::var_os("LAYERFS_REGISTRY_CA").map(Into::into),
        }
    }

    /// What `image ls` and `pull` say of an image: with how much of its
    /// lazy layers is here.
    fn image_info(&self, reference: &str, record: &ImageRecord, fetched: usize) -> ImageInfo {
        ImageInfo {
            reference: reference.to_owned(),
            digest: record.digest.clone(),
            layers: record.layers.clone(),
            size: record.size,
            created: record.created,
            fetched,
            local: self.lazy_bytes(&record.layers),
            whole: Vec::new(),
        }
    }

    pub(super) fn image_ls(&self) -> Outcome<Vec<ImageInfo>> {
        let images = self.catalog.images()?;
        Ok(images
            .iter()
            .map(|(r, record)| self.image_info(r, record, 0))
            .collect())
    }

    /// Forgets the image `reference`; its layers stay for the workspaces
    /// and images using them (`layerfs layer rm` removes one no longer used).
    pub(super) fn image_rm(&self, reference: &str) -> Outcome<String> {
        let full = self.image_name(reference)?;
        let _layers = self.layer_changes.lock();
        self.catalog.remove_image(&full)?;
        Ok(full)
    }

    /// The full reference of an image the store has, given as the user
    /// wrote it (`debian` for `docker.io/library/debian:latest`).
    fn image_name(&self, reference: &str) -> Outcome<String> {
        let full = layerfs_registry::normalize(reference).map_err(|e| invalid(e.message))?;
        match self.catalog.image(&full)? {
            Some(_) => Ok(full),
            None => Err(not_found(format!(
                "no image {full}: see `layerfs image ls`"
            ))),
        }
    }

    /// The layers of the image `reference`, pulling it first if the store
    /// lacks it. `None` when `reference` is no image reference at all.
    pub(super) fn image_layers(
        &self,
        reference: &str,
        registry: &RegistryOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Outcome<Option<ImageLayers>> {
        let Ok(full) = layerfs_registry::normalize(reference) else {
            return Ok(None);
        };
        if let Some(image) = self.catalog.image(&full)? {
            // The platform asked for, where one is: another's image is
            // pulled again for it, as podman does.
            let platform = match &registry.platform {
                Some(wanted) => layerfs_registry::platform_matches(wanted, &image.platform)
                    .map_err(|e| invalid(e.message))?,
                None => true,
            };
            if platform && image.layers.iter().all(|l| self.store.layer(l).is_some()) {
                return Ok(Some(ImageLayers {
                    layers: image.layers,
                    whole: Vec::new(),
                }));
            }
        }
        let pulled = self.pull(reference, registry, progress)?;
        Ok(Some(ImageLayers {
            layers: pulled.layers,
            whole: pulled.whole,
        }))
    }

    /// The images using `layer`.
    pub(super) fn images_using(&self, layer: &LayerId) -> Outcome<Vec<String>> {
        let images = self.catalog.images()?;
        Ok(images
            .into_iter()
            .filter(|(_, image)| image.layers.iter().any(|l| l == layer.as_str()))
            .map(|(reference, _)| reference)
            .collect())
    }
}

/// An image's layers, and the blobs pulling it just now downloaded whole
/// (no table of contents).
pub(super) struct ImageLayers {
    pub layers: Vec<String>,
    pub whole: Vec<String>,
}

/// A registry's error as the control protocol's: `context: message`.
fn registry_error(context: impl std::fmt::Display, e: layerfs_registry::Error) -> ControlError {
    use layerfs_registry::ErrorKind as R;
    let kind = match e.kind {
        R::Invalid => ErrorKind::Invalid,
        R::Unauthorized => ErrorKind::Unauthorized,
        R::Registry => ErrorKind::Registry,
        R::NoSpace => ErrorKind::NoSpace,
        R::Store => ErrorKind::Failed,
    };
    ControlError::new(kind, format!("{context}: {}", e.message))
}
