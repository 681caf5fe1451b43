//! The daemon: the store's one owner. It serves every workspace mounted over
//! NFS from one server on a port kept in the catalog, mounts FUSE
//! workspaces in-process, answers the control socket, and on start-up
//! mounts again whatever a crash left mounted. The requests it answers are
//! in `daemon/requests.rs`.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use layerfs_layers::{remove_tree, LayerId, Store, Workspace};
use layerfs_nfs::{Export, Exports, HandleKey};
use layerfs_rpc::{ServerConfig, ServerHandle};
use parking_lot::Mutex;

use crate::catalog::{Catalog, Door, WorkspaceRecord};
use crate::mounting;
use crate::protocol::{ControlError, ErrorKind, Progress};

pub struct DaemonConfig {
    pub store: PathBuf,
    /// The NFS port to listen on and keep; `None`: the one the store keeps,
    /// or one the system picks the first time.
    pub nfs_port: Option<u16>,
    /// The NFS server's settings; its admission list is the daemon's.
    pub server: ServerConfig,
    /// The program that runs `keeper` (this one), which keeps FUSE mounts
    /// alive when the daemon dies; `None`: they die with it.
    pub keeper: Option<PathBuf>,
    /// How long to wait for another daemon to let go of the store (one
    /// handing over) before giving up.
    pub lock_wait: Duration,
    /// Serve new FUSE mounts through FUSE over io_uring where the kernel
    /// offers it. Off by default: the kernel does not send again what a
    /// ring had taken when its daemon died (it does for /dev/fuse), so a
    /// process waiting on such a request waits until the mount goes.
    pub fuse_io_uring: bool,
}

/// How long a restarted daemon waits for its port, which the dead one's
/// connections may still hold for a moment.
const PORT_WAIT: Duration = Duration::from_secs(10);

/// Runs the daemon for `config.store` until `stop` receives: prints one
/// line saying where it serves once it is ready, and on stop unmounts what
/// it mounted.
pub fn run(config: DaemonConfig, stop: Receiver<()>) -> Result<(), ControlError> {
    std::fs::create_dir_all(&config.store).map_err(|e| {
        host_error(
            format_args!("cannot make the store {}", config.store.display()),
            e,
        )
    })?;
    let root = config
        .store
        .canonicalize()
        .map_err(|e| host_error(format_args!("{}", config.store.display()), e))?;
    let _lock = store_lock::lock_store(&root, config.lock_wait)?;
    // Bound before anything is exported or mounted, so a socket that cannot
    // be made stops the daemon before it has touched a mount.
    let socket = crate::paths::control_socket(&root)?;
    let listener = crate::control::bind(&socket)?;
    let daemon = Arc::new(
        Daemon::open(&root).map_err(|e| host_error(format_args!("{}", root.display()), e))?,
    );
    daemon
        .fuse_io_uring
        .store(config.fuse_io_uring, Ordering::SeqCst);
    daemon.export_recorded_nfs_mounts();
    let server = daemon.listen(config.nfs_port, config.server)?;
    let port = server.local_addr().port();
    *daemon.server.lock() = Some(server);
    #[cfg(target_os = "linux")]
    daemon.start_keeper(config.keeper.as_deref());
    daemon.mount_recorded();
    #[cfg(target_os = "linux")]
    daemon.forget_unclaimed();

    let hand_over_signal = crate::service::hand_over_signal()
        .map_err(|e| host_error(format_args!("cannot install the SIGUSR1 handler"), e))?;
    let handler = daemon.clone();
    crate::control::spawn(
        listener,
        Arc::new(move |r, p: &mut dyn FnMut(Progress)| handler.handle(r, p)),
    )
    .map_err(|e| host_error(format_args!("cannot start the control thread"), e))?;
    let mut out = io::stdout().lock();
    let _ = writeln!(
        out,
        "layerfs daemon ready: store {}, NFS on 127.0.0.1:{port}, control socket {}",
        root.display(),
        socket.display()
    );
    let _ = out.flush();
    drop(out);
    crate::service::ready(&format!("serving the store {}", root.display()));

    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(Duration::from_secs(1)) {
        if hand_over_signal.swap(false, Ordering::SeqCst) {
            match daemon.hand_over() {
                Ok(_) => tracing::info!("SIGUSR1: handing over to the daemon started next"),
                Err(e) => tracing::warn!("SIGUSR1: no hand-over: {e}"),
            }
        }
        if daemon.handing_over.load(Ordering::SeqCst) {
            break;
        }
        daemon.notice_lost_mounts();
        daemon.note_lazy_pieces();
    }
    if daemon.handing_over.load(Ordering::SeqCst) {
        crate::service::stopping("handing over: every mount is left to the next daemon");
        tracing::info!("handing over: every mount is left to the next daemon");
        daemon.leave_mounts();
    } else {
        crate::service::stopping("unmounting every workspace");
        tracing::info!("stopping: unmounting every workspace");
        daemon.unmount_all();
    }
    if let Some(mut server) = daemon.server.lock().take() {
        server.stop();
    }
    daemon.note_lazy_pieces();
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// A workspace the daemon has open: its stack, and its FUSE mount.
struct Open {
    workspace: Workspace,
    #[cfg(target_os = "linux")]
    fuse: Option<layerfs_fuse::Mounted>,
}

impl Open {
    /// The files of this workspace that descriptors write without asking
    /// its filesystem, once every write the kernel had taken before this
    /// call reached the filesystem (a FUSE mount's writeback cache).
    fn settled_writes(&self) -> Outcome<Vec<layerfs_vfs::FileId>> {
        #[cfg(target_os = "linux")]
        if let Some(m) = self.fuse.as_ref().filter(|m| m.is_serving()) {
            m.flush().map_err(|e| {
                host_error(format_args!("cannot flush {}", m.mountpoint().display()), e)
            })?;
            return Ok(m.written_directly());
        }
        Ok(Vec::new())
    }
}

struct Daemon {
    root: PathBuf,
    /// Lazy layers whose completion has started.
    completing: Mutex<std::collections::HashSet<LayerId>>,
    key: HandleKey,
    store: Store,
    catalog: Catalog,
    exports: Arc<Exports>,
    server: Mutex<Option<ServerHandle>>,
    /// Open workspaces, one lock each: a request on a workspace holds its
    /// slot, so requests on one workspace run in turn and requests on
    /// different workspaces side by side.
    open: Slots,
    /// Held while a mountpoint is checked and mounted on, so two
    /// workspaces never both take one empty directory.
    mounting: Mutex<()>,
    /// Held while the store's layers change (an import, a removal) or a
    /// workspace is recorded over them: a layer is never removed while a
    /// workspace is being made on it. Taken after a slot where both are.
    /// An import holds only this: a long one leaves the workspaces' requests
    /// (mount, diff, commit of another workspace...) free.
    layer_changes: Mutex<()>,
    /// What went wrong with a workspace's recorded mount, by name.
    problems: Mutex<HashMap<String, String>>,
    /// The keeper of FUSE sessions, and those it held at the start.
    #[cfg(target_os = "linux")]
    handover: Mutex<kept::Handover>,
    /// Set by a request to hand over: the daemon stops, leaving its mounts.
    handing_over: AtomicBool,
    /// Whether new FUSE mounts are served through FUSE over io_uring.
    fuse_io_uring: AtomicBool,
}

mod images;
#[cfg(target_os = "linux")]
mod kept;
mod lazy;
mod requests;
mod slots;
mod space;
mod store_lock;

use slots::Slots;

type Outcome<T> = Result<T, ControlError>;

fn invalid(message: impl Into<String>) -> ControlError {
    ControlError::new(ErrorKind::Invalid, message)
}

fn not_found(message: impl Into<String>) -> ControlError {
    ControlError::new(ErrorKind::NotFound, message)
}

fn in_use(message: impl Into<String>) -> ControlError {
    ControlError::new(ErrorKind::InUse, message)
}

/// A host or filesystem failure, `context: error`, with the kind its
/// error says.
fn host_error(context: impl std::fmt::Display, e: impl Into<ControlError>) -> ControlError {
    let e: ControlError = e.into();
    ControlError::new(e.kind, format!("{context}: {}", e.message))
}

/// A failure of the store or the host that no errno names.
fn failed(message: impl Into<String>) -> ControlError {
    ControlError::new(ErrorKind::Failed, message)
}

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
        Err(invalid(format!(
            "{name:?}: a workspace name is 1 to 64 letters, digits, '.', '_' or '-', \
             not starting with '.' or '-'"
        )))
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
            open: Slots::default(),
            mounting: Mutex::new(()),
            layer_changes: Mutex::new(()),
            problems: Mutex::new(HashMap::new()),
            #[cfg(target_os = "linux")]
            handover: Mutex::default(),
            handing_over: AtomicBool::new(false),
            fuse_io_uring: AtomicBool::new(false),
            completing: Mutex::default(),
        };
        daemon.sweep_orphans()?;
        daemon.record_unrecorded_commits()?;
        daemon.attach_lazy_layers();
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
            let stack = match Workspace::stack_of(&self.workspace_dir(&name)) {
                Ok(stack) => stack,
                Err(e) => {
                    // One broken workspace does not keep the others from
                    // being served: `ls` shows what is wrong with it.
                    tracing::error!(workspace = %name, "cannot read its stack: {e}");
                    let why = format!("broken: cannot read its stack: {e}");
                    self.problems.lock().insert(name, why);
                    continue;
                }
            };
            let layers = &stack[..stack.len().saturating_sub(1)];
            if layers.len() <= record.layers.len() {
                continue;
            }
            // Opening the workspace finishes the commit's own steps (the
            // copies of moved files) before its layer is read.
            drop(Workspace::open_in(
                &self.workspace_dir(&name),
                Some(&self.store),
            )?);
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
        let kept = self.catalog.nfs_port()?;
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
                    let port = addr.port();
                    let e = ControlError::from(e);
                    return Err(ControlError::new(
                        e.kind,
                        format!(
                            "{}: the store's NFS port {port} is taken by another program",
                            e.message
                        ),
                    ));
                }
            }
        };
        if kept != Some(server.local_addr().port()) {
            self.catalog.set_nfs_port(server.local_addr().port())?;
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
            .workspace(name)?
            .ok_or_else(|| not_found(format!("no workspace {name:?}: see `layerfs ls`")))
    }

    /// Opens workspace `name` if it is not open yet.
    fn ensure_open<'a>(&self, open: &'a mut Option<Open>, name: &str) -> Outcome<&'a mut Open> {
        if open.is_none() {
            let limit = self.record(name)?.size_limit;
            self.open_with(open, name, limit)?;
        }
        Ok(open.as_mut().expect("just opened"))
    }

    /// Opens workspace `name`, not yet open, with the size limit `limit`
    /// (for a workspace not recorded yet).
    fn open_with(&self, open: &mut Option<Open>, name: &str, limit: Option<u64>) -> Outcome<()> {
        self.attach_lazy_layers_of(name)?;
        let workspace = Workspace::open_in(&self.workspace_dir(name), Some(&self.store))
            .map_err(|e| host_error(format_args!("cannot open workspace {name}"), e))?;
        if limit.is_some() {
            workspace
                .fs()
                .set_size_limit(limit)
                .map_err(|e| host_error(format_args!("cannot limit workspace {name}"), e))?;
        }
        *open = Some(Open {
            workspace,
            #[cfg(target_os = "linux")]
            fuse: None,
        });
        Ok(())
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
            signed: Default::default(),
        };
        self.exports
            .add(export)
            .map(|_| ())
            .map_err(|e| failed(e.to_string()))
    }

    /// Before the server listens: every workspace recorded as mounted over
    /// NFS is exported again, so the kernel's first retransmission after a
    /// crash finds its handles.
    fn export_recorded_nfs_mounts(&self) {
        let Ok(all) = self.catalog.workspaces() else {
            return;
        };
        for (name, record) in all {
            if record.mount.as_ref().map(|m| m.door) != Some(Door::Nfs) {
                continue;
            }
            let mut open = self.open.hold(&name);
            let result = self
                .ensure_open(&mut open, &name)
                .and_then(|o| self.add_export(&name, &record, &o.workspace));
            if let Err(e) = result {
                tracing::error!(workspace = %name, "cannot serve again: {e}");
                self.problems.lock().insert(name, e.message);
            }
        }
    }

    /// After the server listens: mounts again what is recorded as mounted
    /// and is not (a dead FUSE mount is detached first). A FUSE mount whose
    /// session the keeper held is served again as it is.
    fn mount_recorded(&self) {
        let Ok(all) = self.catalog.workspaces() else {
            return;
        };
        for (name, record) in all {
            let Some(mount) = record.mount.clone() else {
                continue;
            };
            let mut open = self.open.hold(&name);
            if self.problems.lock().contains_key(&name) {
                continue;
            }
            let result = match mount.door {
                Door::Nfs if mounting::is_mountpoint(&mount.path) => Ok(()),
                Door::Nfs => mounting::mount_nfs(self.port(), &format!("/{name}"), &mount.path)
                    .map_err(ControlError::from),
                Door::Fuse => self.mount_fuse(&mut open, &name, &mount.path),
            };
            match result {
                Ok(()) => {
                    tracing::info!(workspace = %name, path = %mount.path.display(), door = %mount.door, "mounted again")
                }
                Err(e) => {
                    tracing::error!(workspace = %name, "cannot mount again: {e}");
                    self.problems.lock().insert(name, e.message);
                }
            }
        }
    }

    #[cfg(target_os = "linux")]
    fn mount_fuse(&self, open: &mut Option<Open>, name: &str, path: &Path) -> Outcome<()> {
        let o = self.ensure_open(open, name)?;
        let options = layerfs_fuse::Options {
            // The layers never change and the upper is this daemon's alone.
            caching: layerfs_fuse::Caching::Exclusive,
            allow_other: false,
            // One thread reading each mount's /dev/fuse: reads and writes of files passed through never
            // reach it, and a daemon of hundreds of workspaces must not
            // start a thread per core for each.
            threads: 1,
            passthrough: true,
            source: format!("layerfs:{name}"),
            // Where asked and the kernel offers it, each CPU's requests are
            // answered on that CPU, by one ring per CPU serving every mount.
            io_uring: self.fuse_io_uring.load(Ordering::SeqCst),
        };
        let fs = o.workspace.fs();
        let mounted = match self.take_over(name, path, fs.clone(), &options) {
            Some(mounted) => mounted,
            None => layerfs_fuse::mount(fs, path, &options)?,
        };
        self.keep(name, &mounted);
        o.fuse = Some(mounted);
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    fn mount_fuse(&self, _: &mut Option<Open>, _: &str, _: &Path) -> Outcome<()> {
        Err(invalid("FUSE mounts are for Linux: mount with --nfs"))
    }

    /// A FUSE mount taken away from outside (`umount`) is noted for `ls`.
    fn notice_lost_mounts(&self) {
        #[cfg(target_os = "linux")]
        for name in self.open.names() {
            // A workspace a request holds is looked at next time.
            let Some(mut held) = self.open.try_hold(&name) else {
                continue;
            };
            let Some(o) = held.as_mut() else { continue };
            if o.fuse.as_ref().is_some_and(|m| !m.is_serving()) {
                o.fuse = None;
                self.forget_kept(&name);
                tracing::warn!(workspace = %name, "its FUSE mount was taken away");
                self.problems
                    .lock()
                    .insert(name, "unmounted from outside layerfs".into());
            }
        }
    }

    /// Agrees to hand over to a daemon that starts next: refused where a
    /// FUSE mount has no keeper to hold it meanwhile (it would die).
    fn hand_over(&self) -> Outcome<u32> {
        #[cfg(target_os = "linux")]
        if !self.has_keeper() {
            for name in self.open.names() {
                let held = self.open.hold(&name);
                if held.as_ref().is_some_and(|o| o.fuse.is_some()) {
                    return Err(ControlError::new(
                        ErrorKind::Failed,
                        format!(
                            "no keeper holds the FUSE mount of {name}: a hand-over would end \
                             it; stop this daemon (its mounts are unmounted) and start the new one"
                        ),
                    ));
                }
            }
        }
        self.handing_over.store(true, Ordering::SeqCst);
        Ok(std::process::id())
    }

    /// On a hand-over: every FUSE mount stops being served and stays
    /// mounted, its session held by the keeper for the next daemon; NFS
    /// mounts wait for the next daemon's server, as after a crash.
    fn leave_mounts(&self) {
        for name in self.open.names() {
            let mut open = self.open.hold(&name);
            #[cfg(target_os = "linux")]
            if let Some(mounted) = open.as_mut().and_then(|o| o.fuse.take()) {
                mounted.leave();
            }
            *open = None;
        }
    }

    /// On stop: every mounted workspace is unmounted (lazily if busy) and
    /// recorded as unmounted.
    fn unmount_all(&self) {
        let Ok(all) = self.catalog.workspaces() else {
            return;
        };
        for (name, mut record) in all {
            if record.mount.is_none() {
                continue;
            }
            let mut open = self.open.hold(&name);
            match self.take_down(&mut open, &name, &record) {
                Ok(()) => {
                    record.mount = None;
                    let _ = self.catalog.put_workspace(&name, &record);
                }
                Err(e) => tracing::error!(workspace = %name, "{e}"),
            }
            *open = None;
        }
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
