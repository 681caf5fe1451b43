//! The daemon: the store's one owner. It serves every workspace mounted over
//! NFS from one server on a port kept in the catalog, mounts FUSE
//! workspaces in-process, answers the control socket, and on start-up
//! mounts again whatever a crash left mounted.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use layerfs_layers::{remove_tree, LayerId, Store, Workspace};
use layerfs_nfs::{Export, Exports, HandleKey};
use layerfs_rpc::{ServerConfig, ServerHandle};
use parking_lot::Mutex;
use serde::Serialize;

use crate::catalog::{Catalog, Door, LayerNote, MountRecord, WorkspaceRecord};
use crate::mounting;
use crate::protocol::{
    LayerInfo, ProcedureFigures, Progress, Reply, Request, Stats, WorkspaceInfo,
};

pub struct DaemonConfig {
    pub store: PathBuf,
    /// The NFS port to listen on and keep; `None`: the one the store keeps,
    /// or one the system picks the first time.
    pub nfs_port: Option<u16>,
    /// The NFS server's settings; its admission list is the daemon's.
    pub server: ServerConfig,
}

/// How long a restarted daemon waits for its port, which the dead one's
/// connections may still hold for a moment.
const PORT_WAIT: Duration = Duration::from_secs(10);

/// Runs the daemon for `config.store` until `stop` receives: prints one
/// line saying where it serves once it is ready, and on stop unmounts what
/// it mounted.
pub fn run(config: DaemonConfig, stop: Receiver<()>) -> Result<(), String> {
    std::fs::create_dir_all(&config.store)
        .map_err(|e| format!("cannot make the store {}: {e}", config.store.display()))?;
    let root = config
        .store
        .canonicalize()
        .map_err(|e| format!("{}: {e}", config.store.display()))?;
    let _lock = lock_store(&root)?;
    let daemon = Arc::new(Daemon::open(&root).map_err(|e| format!("{}: {e}", root.display()))?);
    daemon.export_recorded_nfs_mounts();
    let server = daemon.listen(config.nfs_port, config.server)?;
    let port = server.local_addr().port();
    *daemon.server.lock() = Some(server);
    daemon.mount_recorded();

    let socket = crate::paths::control_socket(&root).map_err(|e| e.to_string())?;
    let listener = crate::control::bind(&socket).map_err(|e| e.to_string())?;
    let handler = daemon.clone();
    crate::control::spawn(
        listener,
        Arc::new(move |r, p: &mut dyn FnMut(Progress)| handler.handle(r, p)),
    )
    .map_err(|e| format!("cannot start the control thread: {e}"))?;
    let mut out = io::stdout().lock();
    let _ = writeln!(
        out,
        "layerfs daemon ready: store {}, NFS on 127.0.0.1:{port}, control socket {}",
        root.display(),
        socket.display()
    );
    let _ = out.flush();
    drop(out);

    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(Duration::from_secs(1)) {
        daemon.notice_lost_mounts();
    }
    tracing::info!("stopping: unmounting every workspace");
    daemon.unmount_all();
    if let Some(mut server) = daemon.server.lock().take() {
        server.stop();
    }
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// Takes the store's lock, or says which daemon holds it.
fn lock_store(root: &Path) -> Result<File, String> {
    let path = root.join("daemon.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| {
            format!(
                "cannot open {}: {e} (is the store writable?)",
                path.display()
            )
        })?;
    if let Err(e) = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        return Err(match e {
            rustix::io::Errno::WOULDBLOCK => format!(
                "another layerfs daemon (pid {}) serves {}: use it, or stop it first",
                pid.trim(),
                root.display()
            ),
            e => format!("cannot lock {}: {e}", path.display()),
        });
    }
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = writeln!(file, "{}", std::process::id());
    Ok(file)
}

/// A workspace the daemon has open: its stack, and its FUSE mount.
struct Open {
    workspace: Workspace,
    #[cfg(target_os = "linux")]
    fuse: Option<layerfs_fuse::Mounted>,
}

struct Daemon {
    root: PathBuf,
    key: HandleKey,
    store: Store,
    catalog: Catalog,
    exports: Arc<Exports>,
    server: Mutex<Option<ServerHandle>>,
    /// Open workspaces by name; held while a request runs, so requests
    /// happen one at a time.
    open: Mutex<HashMap<String, Open>>,
    /// What went wrong with a workspace's recorded mount, by name.
    problems: Mutex<HashMap<String, String>>,
}

type Outcome<T> = Result<T, String>;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A name a workspace may have: it is a directory name and a MNT path.
fn check_name(name: &str) -> Outcome<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?}: a workspace name is 1 to 64 letters, digits, '.', '_' or '-', \
             not starting with '.' or '-'"
        ))
    }
}

impl Daemon {
    fn open(root: &Path) -> io::Result<Daemon> {
        let store = Store::open(root)?;
        // Signs every NFS handle of the store's workspaces: kept, so handles
        // outlive a restart; private, so no one can forge one.
        let key = HandleKey::load_or_create(&root.join("handle.key"))?;
        let catalog = Catalog::open(&root.join("catalog.redb"))?;
        let daemon = Daemon {
            root: root.to_path_buf(),
            key,
            store,
            catalog,
            exports: Arc::new(Exports::new(key)),
            server: Mutex::new(None),
            open: Mutex::new(HashMap::new()),
            problems: Mutex::new(HashMap::new()),
        };
        daemon.sweep_orphans()?;
        daemon.record_unrecorded_commits()?;
        Ok(daemon)
    }

    fn workspaces_dir(&self) -> PathBuf {
        self.root.join("workspaces")
    }

    fn workspace_dir(&self, name: &str) -> PathBuf {
        self.workspaces_dir().join(name)
    }

    /// Removes workspace directories the catalog does not know: a create
    /// or a remove that a crash cut short.
    fn sweep_orphans(&self) -> io::Result<()> {
        std::fs::create_dir_all(self.workspaces_dir())?;
        let known: Vec<String> = self
            .catalog
            .workspaces()?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        for entry in std::fs::read_dir(self.workspaces_dir())? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !known.contains(&name) {
                tracing::info!(workspace = %name, "removing what a crash left of a workspace");
                remove_tree(&entry.path())?;
            }
        }
        Ok(())
    }

    /// A commit is made in the workspace first (its stack file changes in
    /// one rename) and recorded in the catalog after: a crash between leaves
    /// a stack with more layers than the record. Those committed layers are
    /// added to the store (the same content gives the same id) and recorded.
    fn record_unrecorded_commits(&self) -> io::Result<()> {
        for (name, mut record) in self.catalog.workspaces()? {
            let stack = Workspace::stack_of(&self.workspace_dir(&name))?;
            let layers = &stack[..stack.len().saturating_sub(1)];
            if layers.len() <= record.layers.len() {
                continue;
            }
            for committed in &layers[record.layers.len()..] {
                let layer = self.store.import_dir(committed)?;
                tracing::info!(workspace = %name, %layer, "recording a commit a crash cut short");
                record.layers.push(layer.to_string());
            }
            self.catalog.put_workspace(&name, &record)?;
        }
        Ok(())
    }

    /// Listens on the store's port (a new one the first time), waiting a
    /// little for it if a dead daemon's connections still hold it.
    fn listen(&self, asked: Option<u16>, config: ServerConfig) -> Outcome<ServerHandle> {
        let kept = self.catalog.nfs_port().map_err(|e| e.to_string())?;
        let port = asked.or(kept).unwrap_or(0);
        if let (Some(asked), Some(kept)) = (asked, kept) {
            if asked != kept {
                tracing::warn!(
                    "NFS port {asked} instead of {kept}: mounts made on {kept} will not find the server"
                );
            }
        }
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = std::time::Instant::now() + PORT_WAIT;
        let server = loop {
            match layerfs_nfs::serve_exports(self.exports.clone(), addr, config.clone()) {
                Ok(server) => break server,
                Err(e)
                    if e.kind() == io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    return Err(format!(
                        "{e}: the store's NFS port {} is taken by another program",
                        addr.port()
                    ))
                }
            }
        };
        if kept != Some(server.local_addr().port()) {
            self.catalog
                .set_nfs_port(server.local_addr().port())
                .map_err(|e| e.to_string())?;
        }
        Ok(server)
    }

    fn port(&self) -> u16 {
        self.server
            .lock()
            .as_ref()
            .map_or(0, |s| s.local_addr().port())
    }

    fn record(&self, name: &str) -> Outcome<WorkspaceRecord> {
        self.catalog
            .workspace(name)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no workspace {name:?}: see `layerfs ls`"))
    }

    /// Opens workspace `name` if it is not open yet.
    fn ensure_open<'a>(
        &self,
        open: &'a mut HashMap<String, Open>,
        name: &str,
    ) -> Outcome<&'a mut Open> {
        if !open.contains_key(name) {
            let workspace = Workspace::open(&self.workspace_dir(name))
                .map_err(|e| format!("cannot open workspace {name}: {e}"))?;
            open.insert(
                name.to_string(),
                Open {
                    workspace,
                    #[cfg(target_os = "linux")]
                    fuse: None,
                },
            );
        }
        Ok(open.get_mut(name).expect("just opened"))
    }

    fn add_export(
        &self,
        name: &str,
        record: &WorkspaceRecord,
        workspace: &Workspace,
    ) -> Outcome<()> {
        let export = Export {
            fs: workspace.fs(),
            id: record.export_id,
            path: format!("/{name}").into_bytes(),
            host_path: Vec::new(),
            squash: None,
            key: self.key,
        };
        self.exports
            .add(export)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Before the server listens: every workspace recorded as mounted over
    /// NFS is exported again, so the kernel's first retransmission after a
    /// crash finds its handles.
    fn export_recorded_nfs_mounts(&self) {
        let Ok(all) = self.catalog.workspaces() else {
            return;
        };
        let mut open = self.open.lock();
        for (name, record) in all {
            if record.mount.as_ref().map(|m| m.door) != Some(Door::Nfs) {
                continue;
            }
            let result = self
                .ensure_open(&mut open, &name)
                .and_then(|o| self.add_export(&name, &record, &o.workspace));
            if let Err(e) = result {
                tracing::error!(workspace = %name, "cannot serve again: {e}");
                self.problems.lock().insert(name, e);
            }
        }
    }

    /// After the server listens: mounts again what is recorded as mounted
    /// and is not (a dead FUSE mount is detached first).
    fn mount_recorded(&self) {
        let Ok(all) = self.catalog.workspaces() else {
            return;
        };
        let mut open = self.open.lock();
        for (name, record) in all {
            let Some(mount) = record.mount.clone() else {
                continue;
            };
            if self.problems.lock().contains_key(&name) {
                continue;
            }
            let result = match mount.door {
                Door::Nfs if mounting::is_mountpoint(&mount.path) => Ok(()),
                Door::Nfs => mounting::mount_nfs(self.port(), &format!("/{name}"), &mount.path)
                    .map_err(|e| e.to_string()),
                Door::Fuse => self.mount_fuse(&mut open, &name, &mount.path),
            };
            match result {
                Ok(()) => {
                    tracing::info!(workspace = %name, path = %mount.path.display(), door = %mount.door, "mounted again")
                }
                Err(e) => {
                    tracing::error!(workspace = %name, "cannot mount again: {e}");
                    self.problems.lock().insert(name, e);
                }
            }
        }
    }

    #[cfg(target_os = "linux")]
    fn mount_fuse(&self, open: &mut HashMap<String, Open>, name: &str, path: &Path) -> Outcome<()> {
        let o = self.ensure_open(open, name)?;
        let options = layerfs_fuse::Options {
            // The layers never change and the upper is this daemon's alone.
            caching: layerfs_fuse::Caching::Exclusive,
            allow_other: false,
            threads: 0,
            source: format!("layerfs:{name}"),
        };
        let mounted =
            layerfs_fuse::mount(o.workspace.fs(), path, &options).map_err(|e| e.to_string())?;
        o.fuse = Some(mounted);
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    fn mount_fuse(&self, _: &mut HashMap<String, Open>, _: &str, _: &Path) -> Outcome<()> {
        Err("FUSE mounts are for Linux: mount with --nfs".into())
    }

    /// A FUSE mount taken away from outside (`umount`) is noted for `ls`.
    fn notice_lost_mounts(&self) {
        #[cfg(target_os = "linux")]
        for (name, o) in self.open.lock().iter_mut() {
            if o.fuse.as_ref().is_some_and(|m| !m.is_serving()) {
                o.fuse = None;
                tracing::warn!(workspace = %name, "its FUSE mount was taken away");
                self.problems
                    .lock()
                    .insert(name.clone(), "unmounted from outside layerfs".into());
            }
        }
    }

    fn handle(&self, request: Request, progress: &mut dyn FnMut(Progress)) -> Reply {
        tracing::debug!(?request, "control request");
        let reply = match request {
            Request::LayerImport { source } => reply(self.layer_import(&source, progress)),
            Request::LayerLs => reply(self.layer_ls()),
            Request::LayerRm { id } => reply(self.layer_rm(&id)),
            Request::Create { name, from } => reply(self.create(&name, &from)),
            Request::Mount { name, path, door } => reply(self.mount(&name, &path, door)),
            Request::Unmount { target } => reply(self.unmount(&target)),
            Request::Commit { name, message } => reply(self.commit(&name, message, progress)),
            Request::Ls => reply(self.ls()),
            Request::Rm { name, force } => reply(self.rm(&name, force)),
            Request::Stats => reply(self.stats()),
        };
        if let Some(e) = &reply.error {
            tracing::info!("request refused: {e}");
        }
        reply
    }

    fn layer_import(
        &self,
        source: &Path,
        progress: &mut dyn FnMut(Progress),
    ) -> Outcome<LayerInfo> {
        if !source.is_absolute() {
            return Err(format!("{}: give an absolute path", source.display()));
        }
        let _serial = self.open.lock();
        let id = self
            .store
            .import(source, &mut |done, total| {
                progress(Progress { done, total })
            })
            .map_err(|e| format!("cannot import {}: {e}", source.display()))?;
        let note = self.catalog.note(id.as_str()).map_err(|e| e.to_string())?;
        if note == LayerNote::default() {
            let note = LayerNote {
                created: now(),
                ..LayerNote::default()
            };
            self.catalog
                .put_note(id.as_str(), &note)
                .map_err(|e| e.to_string())?;
        }
        self.layer_info(&id)
    }

    fn layer_info(&self, id: &LayerId) -> Outcome<LayerInfo> {
        let note = self.catalog.note(id.as_str()).map_err(|e| e.to_string())?;
        let used_by = self
            .catalog
            .workspaces()
            .map_err(|e| e.to_string())?
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
        let ids = self.store.layers().map_err(|e| e.to_string())?;
        ids.iter().map(|id| self.layer_info(id)).collect()
    }

    /// The layer an id names, or the one layer it is a prefix of (at least
    /// 4 characters).
    fn find_layer(&self, id: &str) -> Outcome<LayerId> {
        if let Some(layer) = self.store.layer(id) {
            return Ok(layer);
        }
        let ids = self.store.layers().map_err(|e| e.to_string())?;
        let matching: Vec<_> = ids
            .into_iter()
            .filter(|l| id.len() >= 4 && l.as_str().starts_with(id))
            .collect();
        match matching.len() {
            1 => Ok(matching.into_iter().next().expect("one")),
            0 => Err(format!("no layer {id}: see `layerfs layer ls`")),
            n => Err(format!("{id} names {n} layers: give more of the id")),
        }
    }

    fn layer_rm(&self, id: &str) -> Outcome<String> {
        let _serial = self.open.lock();
        let layer = self.find_layer(id)?;
        let info = self.layer_info(&layer)?;
        if !info.used_by.is_empty() {
            let plural = if info.used_by.len() == 1 { "" } else { "s" };
            return Err(format!(
                "layer {layer} is in use by workspace{plural} {}: remove {} first",
                info.used_by.join(", "),
                if plural.is_empty() { "it" } else { "them" }
            ));
        }
        self.store
            .remove(&layer)
            .map_err(|e| format!("cannot remove layer {layer}: {e}"))?;
        let _ = self.catalog.remove_note(layer.as_str());
        Ok(layer.to_string())
    }

    fn create(&self, name: &str, from: &[String]) -> Outcome<WorkspaceInfo> {
        check_name(name)?;
        let open = self.open.lock();
        if self
            .catalog
            .workspace(name)
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Err(format!("workspace {name} already exists"));
        }
        let mut layers = Vec::new();
        let mut parent = None;
        for source in from {
            match self.catalog.workspace(source).map_err(|e| e.to_string())? {
                Some(record) => {
                    layers.extend(record.layers);
                    parent = Some(source.clone());
                }
                None => layers.push(self.find_layer(source)?.to_string()),
            }
        }
        let dirs: Vec<PathBuf> = layers
            .iter()
            .map(|l| {
                self.store
                    .layer_dir(&self.find_layer(l).expect("found above"))
            })
            .collect();
        let record = WorkspaceRecord {
            export_id: self.new_export_id()?,
            layers,
            parent,
            created: now(),
            mount: None,
        };
        // Made first, recorded second: a crash between leaves a directory
        // the next start removes.
        let made = Workspace::create(&self.workspace_dir(name), &dirs)
            .map_err(|e| format!("cannot make workspace {name}: {e}"))?;
        drop(made);
        self.catalog
            .put_workspace(name, &record)
            .map_err(|e| e.to_string())?;
        drop(open);
        Ok(self.info(name, &record))
    }

    /// A random export id no workspace of the store has.
    fn new_export_id(&self) -> Outcome<u64> {
        let taken: Vec<u64> = self
            .catalog
            .workspaces()
            .map_err(|e| e.to_string())?
            .iter()
            .map(|(_, r)| r.export_id)
            .collect();
        loop {
            let id = getrandom::u64().map_err(|e| format!("no randomness: {e}"))?;
            if id != 0 && !taken.contains(&id) {
                return Ok(id);
            }
        }
    }

    fn mount(&self, name: &str, path: &Path, door: Option<Door>) -> Outcome<WorkspaceInfo> {
        let mut open = self.open.lock();
        let mut record = self.record(name)?;
        if let Some(m) = &record.mount {
            return Err(format!(
                "workspace {name} is already mounted on {} (unmount it first)",
                m.path.display()
            ));
        }
        if !path.is_absolute() {
            return Err(format!("{}: give an absolute path", path.display()));
        }
        mounting::check_mountpoint(path).map_err(|e| e.to_string())?;
        let door = door.unwrap_or_else(default_door);
        match door {
            Door::Nfs => {
                let o = self.ensure_open(&mut open, name)?;
                self.add_export(name, &record, &o.workspace)?;
                if let Err(e) = mounting::mount_nfs(self.port(), &format!("/{name}"), path) {
                    self.exports.remove(record.export_id);
                    return Err(e.to_string());
                }
            }
            Door::Fuse => self.mount_fuse(&mut open, name, path)?,
        }
        record.mount = Some(MountRecord {
            path: path.to_path_buf(),
            door,
        });
        self.catalog
            .put_workspace(name, &record)
            .map_err(|e| e.to_string())?;
        self.problems.lock().remove(name);
        tracing::info!(workspace = %name, path = %path.display(), %door, "mounted");
        drop(open);
        Ok(self.info(name, &record))
    }

    /// Finds a workspace by name, or by the path it is mounted on.
    fn named_or_mounted_at(&self, target: &str) -> Outcome<(String, WorkspaceRecord)> {
        if let Some(record) = self.catalog.workspace(target).map_err(|e| e.to_string())? {
            return Ok((target.to_string(), record));
        }
        let path = Path::new(target);
        self.catalog
            .workspaces()
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|(_, r)| r.mount.as_ref().is_some_and(|m| m.path == path))
            .ok_or_else(|| format!("{target}: no workspace of that name or mounted there"))
    }

    fn unmount(&self, target: &str) -> Outcome<WorkspaceInfo> {
        let mut open = self.open.lock();
        let (name, mut record) = self.named_or_mounted_at(target)?;
        if record.mount.is_none() {
            return Err(format!("workspace {name} is not mounted"));
        }
        self.take_down(&mut open, &name, &record)?;
        record.mount = None;
        self.catalog
            .put_workspace(&name, &record)
            .map_err(|e| e.to_string())?;
        drop(open);
        Ok(self.info(&name, &record))
    }

    /// Unmounts workspace `name` and closes it.
    fn take_down(
        &self,
        open: &mut HashMap<String, Open>,
        name: &str,
        record: &WorkspaceRecord,
    ) -> Outcome<()> {
        let Some(mount) = &record.mount else {
            return Ok(());
        };
        match mount.door {
            Door::Nfs => {
                if mounting::is_mountpoint(&mount.path) {
                    mounting::unmount_nfs(&mount.path)
                        .map_err(|e| format!("cannot unmount {}: {e}", mount.path.display()))?;
                }
                self.exports.remove(record.export_id);
            }
            Door::Fuse =>
            {
                #[cfg(target_os = "linux")]
                if let Some(mounted) = open.get_mut(name).and_then(|o| o.fuse.take()) {
                    mounted
                        .unmount()
                        .map_err(|e| format!("cannot unmount {}: {e}", mount.path.display()))?;
                }
            }
        }
        open.remove(name);
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
        let mut open = self.open.lock();
        let mut record = self.record(name)?;
        let o = self.ensure_open(&mut open, name)?;
        let committed = o
            .workspace
            .commit()
            .map_err(|e| format!("cannot commit {name}: {e}"))?;
        let layer = self
            .store
            .import_dir_with(&committed, &mut |done, total| {
                progress(Progress { done, total })
            })
            .map_err(|e| format!("committed {name}, but cannot add it to the store: {e}"))?;
        record.layers.push(layer.to_string());
        self.catalog
            .put_workspace(name, &record)
            .map_err(|e| e.to_string())?;
        let note = LayerNote {
            message,
            workspace: Some(name.to_string()),
            created: now(),
        };
        self.catalog
            .put_note(layer.as_str(), &note)
            .map_err(|e| e.to_string())?;
        if record.mount.is_none() {
            open.remove(name);
        }
        drop(open);
        tracing::info!(workspace = %name, %layer, "committed");
        self.layer_info(&layer)
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
        }
    }

    fn ls(&self) -> Outcome<Vec<WorkspaceInfo>> {
        let all = self.catalog.workspaces().map_err(|e| e.to_string())?;
        Ok(all.iter().map(|(n, r)| self.info(n, r)).collect())
    }

    fn rm(&self, name: &str, force: bool) -> Outcome<String> {
        let mut open = self.open.lock();
        let record = self.record(name)?;
        let children: Vec<String> = self
            .catalog
            .workspaces()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|(_, r)| r.parent.as_deref() == Some(name))
            .map(|(n, _)| n)
            .collect();
        if !force {
            if let Some(m) = &record.mount {
                return Err(format!(
                    "workspace {name} is mounted on {}: unmount it, or give --force",
                    m.path.display()
                ));
            }
            if !children.is_empty() {
                return Err(format!(
                    "workspaces {} were made from {name}: remove them, or give --force",
                    children.join(", ")
                ));
            }
        }
        self.take_down(&mut open, name, &record)?;
        open.remove(name);
        // Forgotten first, removed second: a crash between leaves a
        // directory the next start removes.
        self.catalog
            .remove_workspace(name)
            .map_err(|e| e.to_string())?;
        remove_tree(&self.workspace_dir(name))
            .map_err(|e| format!("cannot remove {}: {e}", self.workspace_dir(name).display()))?;
        Ok(name.to_string())
    }

    fn stats(&self) -> Outcome<Stats> {
        let server = self.server.lock();
        let server = server.as_ref().ok_or("the NFS server is not running")?;
        let t = server.stats();
        Ok(Stats {
            nfs: server.local_addr().to_string(),
            connections: t.connections,
            records: t.records,
            socket_reads: t.socket_reads,
            replies: t.replies,
            socket_writes: t.socket_writes,
            bytes_in: t.bytes_in,
            bytes_out: t.bytes_out,
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

    /// On stop: every mounted workspace is unmounted (lazily if busy) and
    /// recorded as unmounted.
    fn unmount_all(&self) {
        let mut open = self.open.lock();
        let Ok(all) = self.catalog.workspaces() else {
            return;
        };
        for (name, mut record) in all {
            if record.mount.is_none() {
                continue;
            }
            match self.take_down(&mut open, &name, &record) {
                Ok(()) => {
                    record.mount = None;
                    let _ = self.catalog.put_workspace(&name, &record);
                }
                Err(e) => tracing::error!(workspace = %name, "{e}"),
            }
        }
        open.clear();
    }
}

fn reply<T: Serialize>(outcome: Outcome<T>) -> Reply {
    match outcome {
        Ok(data) => Reply::ok(data),
        Err(e) => Reply::error(e),
    }
}

/// NFS where the kernel has a client and we may mount it (root on Linux,
/// anyone on macOS); FUSE otherwise.
fn default_door() -> Door {
    if cfg!(target_os = "macos") {
        return Door::Nfs;
    }
    let root = rustix::process::geteuid().is_root();
    if root && kernel_has_nfs() {
        Door::Nfs
    } else {
        Door::Fuse
    }
}

/// Whether the kernel has an NFS client, loaded or as a module.
fn kernel_has_nfs() -> bool {
    let loaded = std::fs::read_to_string("/proc/filesystems").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().last() == Some("nfs"))
    });
    let module = std::fs::read_to_string("/proc/sys/kernel/osrelease").is_ok_and(|release| {
        Path::new("/lib/modules")
            .join(release.trim())
            .join("kernel/fs/nfs")
            .is_dir()
    });
    loaded || module
}
