//! Lazy layers in the daemon: attached at start and after each pull that
//! makes one, so reads through either door bring their data; completed in
//! the background, one thread per layer, until the registry need not be
//! asked again.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use layerfs_layers::lazy::LazyLayer;
use layerfs_layers::LayerId;

use super::{failed, host_error, Daemon, Outcome};

/// The blob bytes one completion request asks for.
const BATCH: u64 = 8 << 20;

impl Daemon {
    /// Attaches every lazy layer of the store; those not complete are
    /// completed in the background. One that cannot be attached is logged
    /// and left: reads of its missing data fail until the next start.
    pub(super) fn attach_lazy_layers(&self) {
        let ids = match self.store.lazy_layers() {
            Ok(ids) => ids,
            Err(e) => {
                tracing::error!("cannot list the store's lazy layers: {e}");
                return;
            }
        };
        for id in ids {
            match self.attach_lazy(&id) {
                Ok(layer) => self.start_completion(&layer),
                Err(e) => tracing::error!(layer = %id, "cannot attach a lazy layer: {e}"),
            }
        }
    }

    /// Attaches the lazy layers of workspace `name` not attached yet: its
    /// files would read as the holes they are until then, so a workspace
    /// with one that cannot be attached is not opened.
    pub(super) fn attach_lazy_layers_of(&self, name: &str) -> Outcome<()> {
        let stack = layerfs_layers::Workspace::stack_of(&self.workspace_dir(name))
            .map_err(|e| host_error(format_args!("cannot read workspace {name}'s stack"), e))?;
        for dir in &stack[..stack.len().saturating_sub(1)] {
            let Some(id) = dir
                .file_name()
                .and_then(|n| self.store.layer(&n.to_string_lossy()))
            else {
                continue;
            };
            if self.store.is_lazy(&id) && self.store.lazy_layer(&id).is_none() {
                let layer = self.attach_lazy(&id).map_err(|e| {
                    host_error(
                        format_args!(
                            "cannot open workspace {name}: its lazy layer {id} cannot be attached"
                        ),
                        e,
                    )
                })?;
                self.start_completion(&layer);
            }
        }
        Ok(())
    }

    /// Attaches lazy layer `id` with a fetcher for its registry.
    pub(super) fn attach_lazy(&self, id: &LayerId) -> Outcome<Arc<LazyLayer>> {
        let source = self.store.lazy_source(id)?;
        let ca_file = std::env::var_os("LAYERFS_REGISTRY_CA").map(Into::into);
        let fetch = match layerfs_registry::lazy::fetcher(&source, ca_file) {
            Ok(fetch) => Some(fetch),
            Err(e) => {
                tracing::error!(layer = %id, image = %source.name,
                    "no way to fetch a lazy layer's data: {}", e.message);
                None
            }
        };
        let layer = self.store.attach_lazy(id, fetch)?;
        Ok(layer)
    }

    /// Completes `layer` in the background, unless it is complete, its data
    /// is to come only when read, or its completion has started.
    pub(super) fn start_completion(&self, layer: &Arc<LazyLayer>) {
        if !layer.is_complete()
            && !layer.on_read()
            && self.completing.lock().insert(layer.id().clone())
        {
            complete_in_background(layer.clone());
        }
    }

    /// Lazy layers among `layers` get their data only when read
    /// (`on_read`), or are completed in the background.
    pub(super) fn set_on_read(&self, layers: &[LayerId], on_read: bool) -> Outcome<()> {
        for id in layers {
            if let Some(layer) = self.store.lazy_layer(id) {
                layer.set_on_read(on_read)?;
                self.start_completion(&layer);
            }
        }
        Ok(())
    }

    /// Brings in every missing piece of the lazy layers among `layers`,
    /// waiting: what reads the layers' files directly (a push) needs them
    /// whole. One not attached (it could not be at start) is attached now.
    pub(super) fn complete_layers(&self, layers: &[LayerId]) -> Outcome<()> {
        for id in layers {
            let layer = match self.store.lazy_layer(id) {
                Some(layer) => Some(layer),
                None if self.store.is_lazy(id) => Some(self.attach_lazy(id)?),
                None => None,
            };
            if let Some(layer) = layer {
                let never = AtomicBool::new(false);
                if !layer
                    .complete(BATCH, &never)
                    .map_err(|e| host_error(format_args!("cannot complete lazy layer {id}"), e))?
                {
                    return Err(failed(format!("lazy layer {id} was removed meanwhile")));
                }
            }
        }
        Ok(())
    }

    /// Makes the pieces lazy layers have written durable and notes them:
    /// each second, and as the daemon stops.
    pub(super) fn note_lazy_pieces(&self) {
        if let Err(e) = self.store.lazy().note_written() {
            tracing::warn!("noting the pieces written to lazy layers: {e}");
        }
    }

    /// Of the file data of `layers` that are lazy: the bytes here, and in all.
    pub(super) fn lazy_bytes(&self, layers: &[String]) -> Option<(u64, u64)> {
        let mut sum = None;
        for id in layers {
            let Some(layer) = self
                .store
                .layer(id)
                .and_then(|id| self.store.lazy_layer(&id))
            else {
                continue;
            };
            let (local, all) = layer.bytes();
            let (l, a) = sum.unwrap_or((0, 0));
            sum = Some((l + local, a + all));
        }
        sum
    }
}

/// Fetches the rest of `layer` on a thread of its own; a registry that
/// fails is asked again later, less and less often.
fn complete_in_background(layer: Arc<LazyLayer>) {
    let spawned = std::thread::Builder::new()
        .name("lazy-complete".into())
        .spawn(move || {
            let never = AtomicBool::new(false);
            let mut pause = Duration::from_secs(1);
            loop {
                match layer.complete(BATCH, &never) {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(layer = %layer.id(), "completing a lazy layer: {e}; trying again in {} s", pause.as_secs());
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_secs(60));
                        if layer.is_detached() {
                            break;
                        }
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("cannot start completing a lazy layer: {e}");
    }
}
