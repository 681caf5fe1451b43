//! Space: what the store's layers, images and workspaces take on disk, and
//! the prunes that give back what nothing uses.
//!
//! A layer is in use while a workspace stacks on it or an image lists it;
//! an image while a workspace's layers begin with its own. `layer prune`
//! removes the layers not in use; `image prune` forgets the images not in
//! use, then removes the layers only they listed. Each layer goes as
//! `layer rm` takes it (renamed into staging, then deleted: a kill -9 in
//! between leaves it in staging, which the next start empties), under the
//! lock every change of the store's layers takes, so nothing made
//! meanwhile is taken for unused.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use layerfs_layers::LayerId;

use super::{Daemon, Outcome};
use crate::catalog::{ImageRecord, WorkspaceRecord};
use crate::protocol::{Pruned, Space, SpaceOf};

/// The catalog's workspaces and images, read once.
struct Uses {
    workspaces: Vec<(String, WorkspaceRecord)>,
    images: Vec<(String, ImageRecord)>,
}

impl Uses {
    /// Whether a workspace's layers begin with `image`'s.
    fn image_in_use(&self, image: &ImageRecord) -> bool {
        self.workspaces
            .iter()
            .any(|(_, w)| !image.layers.is_empty() && w.layers.starts_with(&image.layers))
    }

    /// The layers a workspace stacks on, and those an image `kept` keeps
    /// (given its reference and record) lists.
    fn layers_in_use(&self, kept: impl Fn(&str, &ImageRecord) -> bool) -> HashSet<&str> {
        let of_workspaces = self.workspaces.iter().flat_map(|(_, w)| &w.layers);
        let of_images = self
            .images
            .iter()
            .filter(|(r, i)| kept(r, i))
            .flat_map(|(_, i)| &i.layers);
        of_workspaces.chain(of_images).map(String::as_str).collect()
    }
}

impl Daemon {
    fn uses(&self) -> Outcome<Uses> {
        Ok(Uses {
            workspaces: self.catalog.workspaces()?,
            images: self.catalog.images()?,
        })
    }

    /// `layerfs system df`.
    pub(super) fn space(&self) -> Outcome<Space> {
        let _layers = self.layer_changes.lock();
        let uses = self.uses()?;
        let layers = self.store.layers()?;
        let mut seen = HashSet::new();
        let mut bytes_of: HashMap<&str, u64> = HashMap::new();
        for layer in &layers {
            let bytes = disk_usage(&self.store.layer_dir(layer), &mut seen);
            bytes_of.insert(layer.as_str(), bytes);
        }
        let bytes = |ids: &mut dyn Iterator<Item = &str>| -> u64 {
            ids.collect::<HashSet<_>>()
                .iter()
                .map(|id| bytes_of.get(id).copied().unwrap_or(0))
                .sum()
        };
        let in_use = uses.layers_in_use(|_, _| true);
        let unused: Vec<&str> = layers
            .iter()
            .map(LayerId::as_str)
            .filter(|l| !in_use.contains(l))
            .collect();
        let unused_images: Vec<&ImageRecord> = uses
            .images
            .iter()
            .map(|(_, i)| i)
            .filter(|i| !uses.image_in_use(i))
            .collect();
        let kept = uses.layers_in_use(|_, i| uses.image_in_use(i));
        let freed_by_image_prune = unused_images
            .iter()
            .flat_map(|i| &i.layers)
            .map(String::as_str)
            .filter(|l| !kept.contains(l) && bytes_of.contains_key(l));
        let workspaces_bytes = uses
            .workspaces
            .iter()
            .map(|(name, _)| disk_usage(&self.workspace_dir(name), &mut seen))
            .sum();
        Ok(Space {
            layers: SpaceOf {
                count: layers.len(),
                bytes: bytes(&mut layers.iter().map(LayerId::as_str)),
                reclaimable: unused.len(),
                reclaimable_bytes: bytes(&mut unused.iter().copied()),
            },
            images: SpaceOf {
                count: uses.images.len(),
                bytes: bytes(
                    &mut uses
                        .images
                        .iter()
                        .flat_map(|(_, i)| i.layers.iter().map(String::as_str)),
                ),
                reclaimable: unused_images.len(),
                reclaimable_bytes: bytes(&mut freed_by_image_prune.into_iter()),
            },
            workspaces: SpaceOf {
                count: uses.workspaces.len(),
                bytes: workspaces_bytes,
                reclaimable: 0,
                reclaimable_bytes: 0,
            },
        })
    }

    /// `layerfs layer prune`, and with `images` `layerfs image prune`.
    pub(super) fn prune(&self, images: bool) -> Outcome<Pruned> {
        let _layers = self.layer_changes.lock();
        let uses = self.uses()?;
        let mut pruned = Pruned::default();
        let mut candidates: Vec<String> = Vec::new();
        if images {
            for (reference, image) in &uses.images {
                if uses.image_in_use(image) {
                    continue;
                }
                // Forgotten first: a crash before its layers go leaves
                // them to the next `layer prune`.
                self.catalog.remove_image(reference)?;
                pruned.images.push(reference.clone());
                candidates.extend(image.layers.iter().cloned());
            }
        } else {
            let layers = self.store.layers()?;
            candidates.extend(layers.iter().map(LayerId::to_string));
        }
        let kept = uses.layers_in_use(|r, _| !pruned.images.iter().any(|p| p == r));
        let mut seen = HashSet::new();
        for id in candidates {
            if kept.contains(id.as_str()) || pruned.layers.contains(&id) {
                continue;
            }
            let Some(layer) = self.store.layer(&id) else {
                continue;
            };
            let bytes = disk_usage(&self.store.layer_dir(&layer), &mut seen);
            self.store
                .remove(&layer)
                .map_err(|e| super::host_error(format_args!("cannot remove layer {layer}"), e))?;
            let _ = self.catalog.remove_note(layer.as_str());
            tracing::info!(layer = %layer, bytes, "pruned");
            pruned.layers.push(id);
            pruned.bytes += bytes;
        }
        Ok(pruned)
    }
}

/// Bytes on disk of the files under `dir` not in `seen` (by device and
/// inode: a file of several names counts once), which it adds them to.
/// What cannot be read counts nothing.
fn disk_usage(dir: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if seen.insert((meta.dev(), meta.ino())) {
            total += meta.blocks() * 512;
        }
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_several_names_is_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/f"), vec![1u8; 64 * 1024]).unwrap();
        std::fs::hard_link(dir.path().join("a/f"), dir.path().join("g")).unwrap();
        let mut seen = HashSet::new();
        let all = disk_usage(dir.path(), &mut seen);
        assert!(all >= 64 * 1024, "{all}");
        assert!(all < 2 * 64 * 1024, "counted twice: {all}");
        assert_eq!(
            disk_usage(&dir.path().join("a"), &mut seen),
            0,
            "seen already"
        );
    }
}
