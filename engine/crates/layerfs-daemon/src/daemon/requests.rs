//! The requests of the control socket, one method each. A request on a
//! workspace holds that workspace's slot (requests on one workspace run in
//! turn, on different ones side by side); layer imports and removals hold
//! the lock over the store's layers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use layerfs_layers::{remove_tree, ChangeKind, LayerId, Workspace};

use super::{
    check_name, default_door, failed, host_error, in_use, invalid, not_found, now, Daemon, Open,
    Outcome,
};
use crate::catalog::{Door, LayerNote, MountRecord, WorkspaceRecord};
use crate::mounting;
use crate::protocol::{
    ControlError, DiffEntry, ErrorKind, Found, LayerCheck, LayerInfo, ProcedureFigures, Progress,
    RegistryOptions, Reply, Request, Response, Stats, WorkspaceInfo,
};

impl Daemon {
    pub(super) fn handle(&self, request: Request, progress: &mut dyn FnMut(Progress)) -> Reply {
        tracing::debug!(?request, "control request");
        let outcome = match request {
            Request::LayerImport { source } => {
                self.layer_import(&source, progress).map(Response::Layer)
            }
            Request::LayerLs => self.layer_ls().map(Response::Layers),
            Request::LayerCheck { id } => self.layer_check(id.as_deref()).map(Response::Checked),
            Request::LayerRm { id } => self.layer_rm(&id).map(Response::Removed),
            Request::Create {
                name,
                from,
                size,
                registry,
                mount,
                door,
            } => {
                let mount = mount.as_deref().map(|path| (path, door));
                self.create(&name, &from, size, mount, &registry, progress)
                    .map(Response::Workspace)
            }
            Request::SetSize { name, size } => self.set_size(&name, size).map(Response::Workspace),
            Request::Mount { name, path, door } => {
                self.mount(&name, &path, door).map(Response::Workspace)
            }
            Request::Unmount { target } => self.unmount(&target).map(Response::Workspace),
            Request::Commit { name, message } => {
                self.commit(&name, message, progress).map(Response::Layer)
            }
            Request::Ls => self.ls().map(Response::Workspaces),
            Request::Rm { name, force } => self.rm(&name, force).map(Response::Removed),
            Request::Stats => self.stats().map(Response::Stats),
            Request::Diff { name } => self.diff(&name).map(Response::Diff),
            Request::Reset { name, paths } => self.reset(&name, &paths).map(Response::Reset),
            Request::Pull {
                reference,
                registry,
            } => self
                .pull(&reference, &registry, progress)
                .map(Response::Image),
            Request::Push {
                sources,
                reference,
                registry,
                format,
            } => self
                .push(&sources, &reference, &registry, format.as_deref(), progress)
                .map(Response::Pushed),
            Request::ImageLs => self.image_ls().map(Response::Images),
            Request::ImageRm { reference } => self.image_rm(&reference).map(Response::Removed),
            Request::HandOver => self.hand_over().map(Response::HandingOver),
            Request::SystemDf => self.space().map(Response::Space),
            Request::LayerPrune => self.prune(false).map(Response::Pruned),
            Request::ImagePrune => self.prune(true).map(Response::Pruned),
        };
        if let Err(e) = &outcome {
            tracing::info!(kind = ?e.kind, "request refused: {e}");
        }
        outcome.into()
    }

    fn layer_import(
        &self,
        source: &Path,
        progress: &mut dyn FnMut(Progress),
    ) -> Outcome<LayerInfo> {
        if !source.is_absolute() {
            return Err(invalid(format!(
                "{}: give an absolute path",
                source.display()
            )));
        }
        let _layers = self.layer_changes.lock();
        let id = self
            .store
            .import(source, &mut |done, total| {
                progress(Progress::of(done, total))
            })
            .map_err(|e| host_error(format_args!("cannot import {}", source.display()), e))?;
        let note = self.catalog.note(id.as_str())?;
        if note == LayerNote::default() {
            let note = LayerNote {
                created: now(),
                ..LayerNote::default()
            };
            self.catalog.put_note(id.as_str(), &note)?;
        }
        self.layer_info(&id)
    }

    fn layer_info(&self, id: &LayerId) -> Outcome<LayerInfo> {
        let note = self.catalog.note(id.as_str())?;
        let used_by = self
            .catalog
            .workspaces()?
            .into_iter()
            .filter(|(_, r)| r.layers.iter().any(|l| l == id.as_str()))
            .map(|(n, _)| n)
            .collect();
        Ok(LayerInfo {
            id: id.to_string(),
            message: note.message,
            workspace: note.workspace,
            created: note.created,
            used_by,
        })
    }

    fn layer_ls(&self) -> Outcome<Vec<LayerInfo>> {
        let ids = self.store.layers()?;
        ids.iter().map(|id| self.layer_info(id)).collect()
    }

    /// Each layer's files (or `id`'s) hashed again against its id. Layers
    /// do not come or go meanwhile.
    fn layer_check(&self, id: Option<&str>) -> Outcome<Vec<LayerCheck>> {
        let _layers = self.layer_changes.lock();
        let ids = match id {
            Some(id) => vec![self.find_layer(id)?],
            None => self.store.layers()?,
        };
        let check = |id: &LayerId| {
            let filling = self.store.lazy_layer(id).filter(|l| !l.is_complete());
            let found = match filling {
                Some(lazy) => {
                    let (here, total) = lazy.bytes();
                    Found::Filling { here, total }
                }
                None => match layerfs_layers::tree_digest(&self.store.layer_dir(id)) {
                    Ok(digest) if digest == id.as_str() => Found::Sound,
                    Ok(digest) => Found::Differs { digest },
                    Err(e) => Found::Unreadable { why: e.to_string() },
                },
            };
            LayerCheck {
                id: id.as_str().to_owned(),
                found,
            }
        };
        Ok(ids.iter().map(check).collect())
    }

    /// The layer an id names, or the one layer it is a prefix of (at least
    /// 4 characters).
    pub(super) fn find_layer(&self, id: &str) -> Outcome<LayerId> {
        if let Some(layer) = self.store.layer(id) {
            return Ok(layer);
        }
        let ids = self.store.layers()?;
        let matching: Vec<_> = ids
            .into_iter()
            .filter(|l| id.len() >= 4 && l.as_str().starts_with(id))
            .collect();
        match matching.len() {
            1 => Ok(matching.into_iter().next().expect("one")),
            0 => Err(not_found(format!("no layer {id}: see `layerfs layer ls`"))),
            n => Err(invalid(format!(
                "{id} names {n} layers: give more of the id"
            ))),
        }
    }

    fn layer_rm(&self, id: &str) -> Outcome<String> {
        let _layers = self.layer_changes.lock();
        let layer = self.find_layer(id)?;
        let info = self.layer_info(&layer)?;
        let images = self.images_using(&layer)?;
        if !images.is_empty() {
            return Err(in_use(format!(
                "layer {layer} is part of image {}: `layerfs image rm` it first",
                images.join(", ")
            )));
        }
        if !info.used_by.is_empty() {
            let plural = if info.used_by.len() == 1 { "" } else { "s" };
            return Err(in_use(format!(
                "layer {layer} is in use by workspace{plural} {}: remove {} first",
                info.used_by.join(", "),
                if plural.is_empty() { "it" } else { "them" }
            )));
        }
        self.store
            .remove(&layer)
            .map_err(|e| host_error(format_args!("cannot remove layer {layer}"), e))?;
        let _ = self.catalog.remove_note(layer.as_str());
        Ok(layer.to_string())
    }

    /// Makes workspace `name` over `from`, and mounts it where `mount` says:
    /// one request, one write of the catalog.
    fn create(
        &self,
        name: &str,
        from: &[String],
        size: Option<u64>,
        mount: Option<(&Path, Option<Door>)>,
        registry: &RegistryOptions,
        progress: &mut dyn FnMut(Progress),
    ) -> Outcome<WorkspaceInfo> {
        check_name(name)?;
        // Images first, and pulled if missing, before any lock is taken: a
        // pull is long, and runs beside other requests.
        let mut images = HashMap::new();
        let mut whole = Vec::new();
        for source in from {
            let known = self.catalog.workspace(source)?.is_some() || looks_like_layer_id(source);
            if !known {
                if let Some(image) = self.image_layers(source, registry, progress)? {
                    whole.extend(image.whole);
                    images.insert(source.clone(), image.layers);
                }
            }
        }
        let mut slot = self.open.hold(name);
        let _layers = self.layer_changes.lock();
        if self.catalog.workspace(name)?.is_some() {
            return Err(ControlError::new(
                ErrorKind::Exists,
                format!("workspace {name} already exists"),
            ));
        }
        let mut layers: Vec<LayerId> = Vec::new();
        let mut parent = None;
        let mut image = None;
        for (i, source) in from.iter().enumerate() {
            match self.catalog.workspace(source)? {
                Some(record) => {
                    for id in &record.layers {
                        layers.push(self.find_layer(id)?);
                    }
                    parent = Some(source.clone());
                    if i == 0 {
                        image = record.image;
                    }
                }
                None => match images.get(source) {
                    Some(layers_of_image) => {
                        for id in layers_of_image {
                            layers.push(self.find_layer(id)?);
                        }
                        if i == 0 {
                            image = layerfs_registry::normalize(source).ok();
                        }
                    }
                    None => layers.push(self.find_layer(source)?),
                },
            }
        }
        let dirs: Vec<PathBuf> = layers.iter().map(|l| self.store.layer_dir(l)).collect();
        let mut record = WorkspaceRecord {
            export_id: self.new_export_id()?,
            layers: layers.iter().map(LayerId::to_string).collect(),
            parent,
            image,
            created: now(),
            mount: None,
            size_limit: size,
        };
        // Made first, recorded second: a crash between leaves a directory
        // the next start removes.
        let made = Workspace::create_in(&self.workspace_dir(name), &dirs, Some(&self.store))
            .map_err(|e| host_error(format_args!("cannot make workspace {name}"), e))?;
        drop(made);
        // Mounted before it is recorded, as a mount alone is: a crash
        // between leaves a directory and a mount the next start removes.
        let undo = |slot: &mut Option<Open>, record: &WorkspaceRecord| {
            if let Err(e) = self.take_down(slot, name, record) {
                tracing::warn!(workspace = %name, "{}", e.message);
            }
            *slot = None;
            if let Err(e) = remove_tree(&self.workspace_dir(name)) {
                tracing::warn!(workspace = %name, "cannot remove its directory: {e}");
            }
        };
        if let Some((path, door)) = mount {
            match self.attach(&mut slot, name, &record, path, door) {
                Ok(m) => record.mount = Some(m),
                Err(e) => {
                    undo(&mut slot, &record);
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.catalog.put_workspace(name, &record) {
            undo(&mut slot, &record);
            return Err(e.into());
        }
        Ok(WorkspaceInfo {
            whole,
            ..self.info(name, &record)
        })
    }

    /// A random export id no workspace of the store has.
    fn new_export_id(&self) -> Outcome<u64> {
        let taken: Vec<u64> = self
            .catalog
            .workspaces()?
            .iter()
            .map(|(_, r)| r.export_id)
            .collect();
        loop {
            let id = getrandom::u64().map_err(|e| failed(format!("no randomness: {e}")))?;
            if id != 0 && !taken.contains(&id) {
                return Ok(id);
            }
        }
    }

    fn mount(&self, name: &str, path: &Path, door: Option<Door>) -> Outcome<WorkspaceInfo> {
        let mut open = self.open.hold(name);
        let mut record = self.record(name)?;
        if let Some(m) = &record.mount {
            return Err(in_use(format!(
                "workspace {name} is already mounted on {} (unmount it first)",
                m.path.display()
            )));
        }
        record.mount = Some(self.attach(&mut open, name, &record, path, door)?);
        self.catalog.put_workspace(name, &record)?;
        drop(open);
        Ok(self.info(name, &record))
    }

    /// Mounts workspace `name` (of `record`) on `path` through `door` (the
    /// platform's default if none); the caller records the mount.
    fn attach(
        &self,
        open: &mut Option<Open>,
        name: &str,
        record: &WorkspaceRecord,
        path: &Path,
        door: Option<Door>,
    ) -> Outcome<MountRecord> {
        if !path.is_absolute() {
            return Err(invalid(format!(
                "{}: give an absolute path",
                path.display()
            )));
        }
        let _mountpoints = self.mounting.lock();
        mounting::check_mountpoint(path).map_err(|e| invalid(e.to_string()))?;
        if open.is_none() {
            self.open_with(open, name, record.size_limit)?;
        }
        let door = door.unwrap_or_else(default_door);
        match door {
            Door::Nfs => {
                let o = self.ensure_open(open, name)?;
                self.add_export(name, record, &o.workspace)?;
                if let Err(e) = mounting::mount_nfs(self.port(), &format!("/{name}"), path) {
                    self.exports.remove(record.export_id);
                    return Err(e.into());
                }
            }
            Door::Fuse => self.mount_fuse(open, name, path)?,
        }
        self.problems.lock().remove(name);
        tracing::info!(workspace = %name, path = %path.display(), %door, "mounted");
        Ok(MountRecord {
            path: path.to_path_buf(),
            door,
        })
    }

    /// Finds a workspace by name, or by the path it is mounted on.
    fn named_or_mounted_at(&self, target: &str) -> Outcome<(String, WorkspaceRecord)> {
        if let Some(record) = self.catalog.workspace(target)? {
            return Ok((target.to_string(), record));
        }
        let path = Path::new(target);
        self.catalog
            .workspaces()?
            .into_iter()
            .find(|(_, r)| r.mount.as_ref().is_some_and(|m| m.path == path))
            .ok_or_else(|| {
                not_found(format!(
                    "{target}: no workspace of that name or mounted there"
                ))
            })
    }

    fn unmount(&self, target: &str) -> Outcome<WorkspaceInfo> {
        let (name, _) = self.named_or_mounted_at(target)?;
        let mut open = self.open.hold(&name);
        // Read again under its lock: a request before this one may have
        // changed it.
        let mut record = self.record(&name)?;
        if record.mount.is_none() {
            return Err(invalid(format!("workspace {name} is not mounted")));
        }
        self.take_down(&mut open, &name, &record)?;
        record.mount = None;
        self.catalog.put_workspace(&name, &record)?;
        drop(open);
        Ok(self.info(&name, &record))
    }

    /// Unmounts workspace `name` and closes it.
    pub(super) fn take_down(
        &self,
        open: &mut Option<Open>,
        name: &str,
        record: &WorkspaceRecord,
    ) -> Outcome<()> {
        let Some(mount) = &record.mount else {
            return Ok(());
        };
        match mount.door {
            Door::Nfs => {
                if mounting::is_mountpoint(&mount.path) {
                    mounting::unmount_nfs(&mount.path).map_err(|e| {
                        host_error(format_args!("cannot unmount {}", mount.path.display()), e)
                    })?;
                }
                self.exports.remove(record.export_id);
            }
            Door::Fuse => {
                #[cfg(target_os = "linux")]
                if let Some(mounted) = open.as_mut().and_then(|o| o.fuse.take()) {
                    // The keeper's copy would keep the session alive.
                    self.forget_kept(name);
                    mounted.unmount().map_err(|e| {
                        host_error(format_args!("cannot unmount {}", mount.path.display()), e)
                    })?;
                }
            }
        }
        *open = None;
        self.problems.lock().remove(name);
        tracing::info!(workspace = %name, path = %mount.path.display(), "unmounted");
        Ok(())
    }

    fn commit(
        &self,
        name: &str,
        message: Option<String>,
        progress: &mut dyn FnMut(Progress),
    ) -> Outcome<LayerInfo> {
        let mut open = self.open.hold(name);
        let mut record = self.record(name)?;
        let o = self.ensure_open(&mut open, name)?;
        let written = o.settled_writes()?;
        let committed = o
            .workspace
            .commit(&written)
            .map_err(|e| host_error(format_args!("cannot commit {name}"), e))?;
        let _layers = self.layer_changes.lock();
        let layer = self
            .store
            .import_dir_with(&committed, &mut |done, total| {
                progress(Progress::of(done, total))
            })
            .map_err(|e| {
                host_error(
                    format_args!("committed {name}, but cannot add it to the store"),
                    e,
                )
            })?;
        record.layers.push(layer.to_string());
        self.catalog.put_workspace(name, &record)?;
        let note = LayerNote {
            message,
            workspace: Some(name.to_string()),
            created: now(),
        };
        self.catalog.put_note(layer.as_str(), &note)?;
        if record.mount.is_none() {
            *open = None;
        }
        drop(open);
        tracing::info!(workspace = %name, %layer, "committed");
        self.layer_info(&layer)
    }

    /// Sets or lifts the limit on what the workspace's upper may hold; an
    /// open workspace has it at once.
    fn set_size(&self, name: &str, size: Option<u64>) -> Outcome<WorkspaceInfo> {
        let open = self.open.hold(name);
        let mut record = self.record(name)?;
        if let Some(o) = open.as_ref() {
            o.workspace
                .fs()
                .set_size_limit(size)
                .map_err(|e| host_error(format_args!("cannot limit {name}"), e))?;
        }
        record.size_limit = size;
        self.catalog.put_workspace(name, &record)?;
        drop(open);
        Ok(self.info(name, &record))
    }

    /// What the workspace changed over its layers, mounted or not.
    pub(super) fn diff(&self, name: &str) -> Outcome<Vec<DiffEntry>> {
        let mut open = self.open.hold(name);
        let record = self.record(name)?;
        let o = self.ensure_open(&mut open, name)?;
        let changes = o
            .workspace
            .fs()
            .diff()
            .map_err(|e| host_error(format_args!("cannot read the changes of {name}"), e))?;
        if record.mount.is_none() {
            *open = None;
        }
        Ok(changes
            .into_iter()
            .map(|c| DiffEntry {
                kind: match c.kind {
                    ChangeKind::Added => "A",
                    ChangeKind::Changed => "C",
                    ChangeKind::Deleted => "D",
                }
                .into(),
                path: String::from_utf8_lossy(&c.path).into_owned(),
                changed: c.what.into_iter().map(String::from).collect(),
            })
            .collect())
    }

    /// Throws away the workspace's changes under `paths` (all without any),
    /// mounted or not; a FUSE mount's kernel caches of what changed are
    /// dropped. Returns how many names changed.
    fn reset(&self, name: &str, paths: &[String]) -> Outcome<usize> {
        let paths = paths
            .iter()
            .map(|p| workspace_path(p))
            .collect::<Outcome<Vec<_>>>()?;
        let mut open = self.open.hold(name);
        let record = self.record(name)?;
        let o = self.ensure_open(&mut open, name)?;
        // Writes the kernel still holds reach the upper first: sent after
        // the reset, they would bring back what it threw away.
        o.settled_writes()?;
        let done = o
            .workspace
            .fs()
            .reset(&paths)
            .map_err(|e| host_error(format_args!("cannot reset {name}"), e))?;
        #[cfg(target_os = "linux")]
        if let Some(m) = &o.fuse {
            m.invalidate(&done.names, &done.files);
        }
        if let Some(mount) = record.mount.as_ref().filter(|m| m.door == Door::Nfs) {
            mounting::refresh_client_dirs(&mount.path, &done.dirs_changed);
        }
        if record.mount.is_none() {
            *open = None;
        }
        tracing::info!(workspace = %name, names = done.names.len(), "reset");
        Ok(done.names.len())
    }

    fn info(&self, name: &str, record: &WorkspaceRecord) -> WorkspaceInfo {
        let state = match (self.problems.lock().get(name), &record.mount) {
            (Some(problem), _) => problem.clone(),
            (None, Some(_)) => "mounted".to_string(),
            (None, None) => "unmounted".to_string(),
        };
        WorkspaceInfo {
            name: name.to_string(),
            layers: record.layers.clone(),
            parent: record.parent.clone(),
            created: record.created,
            mount: record.mount.clone(),
            state,
            size_limit: record.size_limit,
            size_used: self.size_used(name, record),
            local: self.lazy_bytes(&record.layers),
            whole: Vec::new(),
        }
    }

    /// What a limited workspace's upper holds, where it is open and the
    /// workspaces' lock is free (`ls` waits for no other request).
    fn size_used(&self, name: &str, record: &WorkspaceRecord) -> Option<u64> {
        record.size_limit?;
        let open = self.open.try_hold(name)?;
        open.as_ref()?
            .workspace
            .fs()
            .size_used()
            .ok()
            .map(|(used, _)| used)
    }

    fn ls(&self) -> Outcome<Vec<WorkspaceInfo>> {
        let all = self.catalog.workspaces()?;
        Ok(all.iter().map(|(n, r)| self.info(n, r)).collect())
    }

    fn rm(&self, name: &str, force: bool) -> Outcome<String> {
        let mut open = self.open.hold(name);
        let record = self.record(name)?;
        let children: Vec<String> = self
            .catalog
            .workspaces()?
            .into_iter()
            .filter(|(_, r)| r.parent.as_deref() == Some(name))
            .map(|(n, _)| n)
            .collect();
        if !force {
            if let Some(m) = &record.mount {
                return Err(in_use(format!(
                    "workspace {name} is mounted on {}: unmount it, or give --force",
                    m.path.display()
                )));
            }
            if !children.is_empty() {
                return Err(in_use(format!(
                    "workspaces {} were made from {name}: remove them, or give --force",
                    children.join(", ")
                )));
            }
        }
        self.take_down(&mut open, name, &record)?;
        *open = None;
        // Forgotten first, removed second: a crash between leaves a
        // directory the next start removes.
        self.catalog.remove_workspace(name)?;
        remove_tree(&self.workspace_dir(name)).map_err(|e| {
            host_error(
                format_args!("cannot remove {}", self.workspace_dir(name).display()),
                e,
            )
        })?;
        Ok(name.to_string())
    }

    fn stats(&self) -> Outcome<Stats> {
        let server = self.server.lock();
        let server = server
            .as_ref()
            .ok_or_else(|| failed("the NFS server is not running"))?;
        Ok(Stats {
            nfs: server.local_addr().to_string(),
            transport: server.stats(),
            procedures: server
                .dispatcher()
                .procedures()
                .into_iter()
                .map(|p| ProcedureFigures {
                    program: match p.program {
                        layerfs_nfs::NFS_PROGRAM => "NFS".into(),
                        layerfs_nfs::MOUNT_PROGRAM => "MOUNT".into(),
                        n => n.to_string(),
                    },
                    procedure: p.name.into(),
                    calls: p.calls,
                    p50_us: p.p50.as_micros() as u64,
                    p99_us: p.p99.as_micros() as u64,
                })
                .collect(),
        })
    }
}

/// A path inside a workspace (`/etc/name` or `etc/name`) as its names;
/// one that climbs out (`..`) is refused.
fn workspace_path(path: &str) -> Outcome<Vec<Vec<u8>>> {
    let names: Vec<Vec<u8>> = path
        .split('/')
        .filter(|n| !n.is_empty() && *n != ".")
        .map(|n| n.as_bytes().to_vec())
        .collect();
    if names.iter().any(|n| n == b"..") {
        return Err(invalid(format!(
            "{path}: a path inside the workspace, without `..`"
        )));
    }
    Ok(names)
}

/// Whether `source` is read as a layer id (or its first characters): hex
/// digits only. Such a name is never pulled; an image named so is given in
/// full (`docker.io/library/NAME`).
fn looks_like_layer_id(source: &str) -> bool {
    !source.is_empty() && source.bytes().all(|b| b.is_ascii_hexdigit())
}
