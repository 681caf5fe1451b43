//! The workspace commands: each one request to the store's daemon, its
//! answer printed for people or, with --json, for scripts.

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use layerfs_daemon::catalog::Door;
use layerfs_daemon::protocol::{
    Answer, DiffEntry, Found, LayerCheck, LayerInfo, Progress, Reply, Request, Stats, WorkspaceInfo,
};
use layerfs_rpc::{Admission, ServerConfig};

use crate::interrupted;

#[derive(clap::Args)]
pub struct DaemonArgs {
    /// The 127.0.0.1 port of the NFS server, kept in the store for the next
    /// start [default: the one the store keeps, or a free one the first time]
    #[arg(long, value_name = "PORT")]
    nfs_port: Option<u16>,
    /// Seconds a client has to send the rest of an NFS call once its first
    /// byte arrived.
    #[arg(long, default_value_t = ServerConfig::default().record_deadline.as_secs(), value_name = "SECS")]
    record_deadline: u64,
    /// Seconds without a call after which an NFS connection is closed.
    #[arg(long, default_value_t = ServerConfig::default().idle_timeout.as_secs(), value_name = "SECS")]
    idle_timeout: u64,
    /// Microseconds a CPU is kept awake at the lowest priority after a reply
    /// of under 256 KiB leaves for an NFS client that was waiting for it, for
    /// its next call; 0 for never.
    #[arg(long, default_value_t = ServerConfig::default().stay_awake.as_micros() as u64, value_name = "MICROS")]
    stay_awake: u64,
    /// Take over from the daemon running for this store (an older binary,
    /// say) with nothing unmounted: it stops serving, and this one serves
    /// its NFS and FUSE mounts from where it left them. Programs using them
    /// wait for the moment between and see no error.
    #[arg(long)]
    upgrade: bool,
    /// Serve FUSE mounts through FUSE over io_uring where the kernel offers
    /// it (Linux 6.14+, the fuse module's enable_uring set to Y): each
    /// CPU's requests answered on that CPU, by one ring per CPU for all
    /// mounts. A mount keeps the route it was made with across restarts.
    /// Beware: if this daemon is killed or upgraded while a ring holds a
    /// request, that request is never answered (the kernel sends again
    /// only what was read from /dev/fuse), and its caller waits until the
    /// mount is unmounted.
    #[arg(long)]
    io_uring: bool,
}

#[derive(clap::Subcommand)]
pub enum LayerCommand {
    /// Import a directory or a layer tarball (OCI/Docker, plain or gzip;
    /// whiteouts kept) as a layer; prints its id. The same content gives
    /// the same id.
    Import {
        /// A directory or a .tar / .tar.gz file.
        source: PathBuf,
    },
    /// List the layers and the workspaces using each.
    Ls,
    /// Remove a layer no workspace uses.
    Rm {
        /// The layer's id, or its first characters (at least 4).
        id: String,
    },
    /// Remove every layer no workspace stacks on and no image lists.
    Prune,
    /// Hash each layer's files again and compare the digest with its id
    /// (a lazy layer still filling: each piece is checked as it comes).
    /// Fails if one differs or cannot be read.
    Check {
        /// One layer's id, or its first characters (at least 4); all if none.
        id: Option<String>,
    },
}

#[derive(clap::Args)]
pub struct CreateArgs {
    /// The workspace's name: letters, digits, '.', '_', '-'.
    name: String,
    /// A layer id (or its first 4+ characters), a workspace whose layers
    /// (commits included, changes not yet committed excluded) to start
    /// from, or an image reference (pulled if the store lacks it; a name of
    /// hex digits only is read as a layer id); repeat for more, bottom
    /// first. None: an empty workspace.
    #[arg(long, value_name = "LAYER|WORKSPACE|IMAGE")]
    from: Vec<String>,
    #[command(flatten)]
    registry: crate::images::RegistryArgs,
    #[command(flatten)]
    lazy: crate::images::LazyArgs,
    /// The most its changes may hold (file sizes, and 4 KiB per file and
    /// directory): bytes, or with K, M, G or T (powers of 1024). A write,
    /// copy-up or new file past it fails with "No space left on device".
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    size: Option<u64>,
    /// Mount it on this existing, empty directory once made, in the same
    /// request (as `layerfs mount` would).
    #[arg(long, value_name = "DIR")]
    mount: Option<PathBuf>,
    #[command(flatten)]
    door: DoorArgs,
}

/// Which door a mount goes through.
#[derive(clap::Args)]
pub struct DoorArgs {
    /// Through the kernel's NFS client (the default as root on Linux when
    /// the kernel has one, and on macOS).
    #[arg(long, conflicts_with = "fuse")]
    nfs: bool,
    /// Through FUSE (Linux; the default for a user who is not root, or
    /// without a kernel NFS client).
    #[arg(long)]
    fuse: bool,
}

impl DoorArgs {
    fn door(&self) -> Option<Door> {
        match (self.nfs, self.fuse) {
            (true, _) => Some(Door::Nfs),
            (_, true) => Some(Door::Fuse),
            _ => None,
        }
    }
}

#[derive(clap::Args)]
pub struct SetArgs {
    name: String,
    /// The most its changes may hold, as for `create --size`; `none` lifts
    /// the limit. Below what it holds, only changes that free room go on.
    #[arg(long, value_name = "SIZE|none")]
    size: Option<String>,
}

/// A size as people write it: `65536`, `64K`, `64M`, `1.5G`, `2TiB`.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text}: not a size (65536, 64K, 64M, 1G)"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(format!("{text}: unknown unit {unit:?} (K, M, G, T)")),
    };
    let bytes = number * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text}: out of range"));
    }
    Ok(bytes as u64)
}

fn parse_size_or_none(text: &str) -> Result<Option<u64>, String> {
    match text {
        "none" => Ok(None),
        other => parse_size(other).map(Some),
    }
}

/// `12.3M`-style bytes for tables.
pub fn human(bytes: u64) -> String {
    let units = ["", "K", "M", "G", "T"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes}"),
        _ => format!("{value:.1}{}", units[unit]),
    }
}

#[derive(clap::Args)]
pub struct MountArgs {
    name: String,
    /// An existing, empty directory.
    path: PathBuf,
    #[command(flatten)]
    door: DoorArgs,
}

#[derive(clap::Args)]
pub struct UnmountArgs {
    /// A workspace's name, or the directory it is mounted on.
    target: String,
}

#[derive(clap::Args)]
pub struct CommitArgs {
    name: String,
    /// Says what the new layer holds (shown by `layer ls`).
    #[arg(long, short)]
    message: Option<String>,
}

#[derive(clap::Args)]
pub struct DiffArgs {
    name: String,
}

#[derive(clap::Args)]
pub struct ResetArgs {
    name: String,
    /// Paths in the workspace (`/etc`, `src/main.rs`); none for everything.
    paths: Vec<String>,
}

#[derive(clap::Args)]
pub struct RmArgs {
    name: String,
    /// Unmount it first if mounted; remove it even if others were made from it.
    #[arg(long)]
    force: bool,
}

/// Holds the store's FUSE sessions for its daemon (`layerfs_daemon::keeper`).
pub fn keeper(client: Client) -> Result<(), String> {
    let store = client.store_path()?;
    let root = store
        .canonicalize()
        .map_err(|e| format!("{}: {e}", store.display()))?;
    #[cfg(target_os = "linux")]
    return layerfs_daemon::keeper::run(&root).map_err(|e| format!("keeper: {e}"));
    #[cfg(not(target_os = "linux"))]
    return Err(format!(
        "{}: FUSE sessions are kept only on Linux",
        root.display()
    ));
}

/// Runs the daemon in the foreground until SIGINT or SIGTERM.
pub fn daemon(client: Client, args: DaemonArgs) -> Result<(), String> {
    let store = client.store_path()?;
    let server = ServerConfig {
        record_deadline: Duration::from_secs(args.record_deadline.max(1)),
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        stay_awake: Duration::from_micros(args.stay_awake),
        ..daemon_server_config()
    };
    if args.upgrade {
        let pid: u32 = client
            .call(Request::HandOver)?
            .ok_or("no answer to the hand-over")?;
        tracing::info!("the daemon (pid {pid}) hands over");
    }
    let stop = interrupted()?;
    let config = layerfs_daemon::DaemonConfig {
        store,
        nfs_port: args.nfs_port,
        server,
        keeper: std::env::current_exe().ok(),
        // The daemon handing over lets go of the store within a second.
        lock_wait: Duration::from_secs(if args.upgrade { 60 } else { 0 }),
        fuse_io_uring: args.io_uring,
    };
    layerfs_daemon::run(config, stop).map_err(|e| e.message)
}

/// The daemon's NFS server settings: the defaults, and only root and this
/// user let in.
pub fn daemon_server_config() -> ServerConfig {
    ServerConfig {
        // The kernel's NFS client connects from root's sockets; this user's
        // own tools from theirs. Other local users are refused.
        admit: Admission::Uids(vec![0, rustix::process::geteuid().as_raw()]),
        ..ServerConfig::default()
    }
}

/// What every command needs to reach the daemon.
pub struct Client {
    pub store: Option<PathBuf>,
    pub json: bool,
}

/// An existing path, made absolute for the daemon (which has its own
/// working directory).
fn absolute(path: &Path) -> Result<PathBuf, String> {
    path.canonicalize().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => format!("{}: does not exist", path.display()),
        _ => format!("{}: {e}", path.display()),
    })
}

/// What a command says when its daemon stops before answering.
const DAEMON_GONE: &str = "the layerfs daemon stopped before it answered, and what was asked \
     may or may not be done (see `layerfs ls` once it is back)";

impl Client {
    fn store_path(&self) -> Result<PathBuf, String> {
        match &self.store {
            Some(store) => Ok(store.clone()),
            None => layerfs_daemon::paths::default_store().map_err(|e| e.to_string()),
        }
    }

    /// Sends `request`; with --json prints its result (or `{"error":
    /// {"kind", "message"}}`) as JSON, else hands the result back for
    /// printing.
    pub(crate) fn call<T: Answer>(&self, request: Request) -> Result<Option<T>, String> {
        let store = self.store_path()?;
        let no_daemon = || {
            format!(
                "no layerfs daemon is running for the store {}: start one with `layerfs daemon{}`",
                store.display(),
                self.store
                    .as_ref()
                    .map(|s| format!(" --store {}", s.display()))
                    .unwrap_or_default()
            )
        };
        let store = store.canonicalize().map_err(|_| no_daemon())?;
        let socket = layerfs_daemon::paths::socket_to_reach(&store).map_err(|e| e.to_string())?;
        let mut bar = ProgressShown::new(!self.json && io::stderr().is_terminal());
        let reply: Reply =
            layerfs_daemon::control::call_with_progress(&socket, &request, &mut |p| bar.show(p))
                .map_err(|e| match e.kind() {
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => no_daemon(),
                    // Killed, crashed or stopped in the middle of the request.
                    io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe => format!("{DAEMON_GONE}: {e}"),
                    _ => format!("cannot talk to the daemon at {}: {e}", socket.display()),
                })?;
        drop(bar);
        let response = match reply {
            Reply::Ok(response) => response,
            Reply::Error(e) => {
                if self.json {
                    print_json(&serde_json::json!({ "error": e }))?;
                }
                return Err(e.message);
            }
        };
        if self.json {
            let mut value = serde_json::to_value(&response).map_err(|e| e.to_string())?;
            print_json(&value["data"].take())?;
            return Ok(None);
        }
        T::from_response(response)
            .map(Some)
            .ok_or_else(|| "the daemon answered with something else: is it another version?".into())
    }

    pub fn layer(&self, command: LayerCommand) -> Result<(), String> {
        match command {
            LayerCommand::Import { source } => {
                let source = absolute(&source)?;
                if let Some(layer) = self.call::<LayerInfo>(Request::LayerImport { source })? {
                    println!("{}", layer.id);
                }
            }
            LayerCommand::Ls => {
                if let Some(layers) = self.call::<Vec<LayerInfo>>(Request::LayerLs)? {
                    print_layers(&layers);
                }
            }
            LayerCommand::Rm { id } => {
                if let Some(id) = self.call::<String>(Request::LayerRm { id })? {
                    println!("removed layer {id}");
                }
            }
            LayerCommand::Prune => self.prune(Request::LayerPrune)?,
            LayerCommand::Check { id } => {
                let Some(checked) = self.call::<Vec<LayerCheck>>(Request::LayerCheck { id })?
                else {
                    return Ok(());
                };
                let mut bad = 0;
                for layer in &checked {
                    let what = match &layer.found {
                        Found::Sound => "sound".to_owned(),
                        Found::Filling { here, total } => format!(
                            "lazy, {} of {} here: each piece checked as it comes",
                            human(*here),
                            human(*total)
                        ),
                        Found::Differs { digest } => {
                            bad += 1;
                            format!("DIFFERS: its files hash to {digest}")
                        }
                        Found::Unreadable { why } => {
                            bad += 1;
                            format!("UNREADABLE: {why}")
                        }
                    };
                    println!("{} {what}", layer.id);
                }
                if bad > 0 {
                    return Err(format!(
                        "{bad} of {} layers are not what their ids say",
                        checked.len()
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn create(&self, args: CreateArgs) -> Result<(), String> {
        if args.mount.is_none() && args.door.door().is_some() {
            return Err("--nfs and --fuse say how to mount: give --mount DIR too".into());
        }
        let request = Request::Create {
            name: args.name,
            from: args.from,
            size: args.size,
            registry: args.registry.pulling(args.lazy),
            mount: args.mount.as_deref().map(absolute).transpose()?,
            door: args.door.door(),
        };
        if let Some(w) = self.call::<WorkspaceInfo>(request)? {
            crate::images::say_whole(&w.whole);
            let n = w.layers.len();
            println!(
                "created {} over {n} layer{}",
                w.name,
                if n == 1 { "" } else { "s" }
            );
            if let Some(m) = &w.mount {
                println!("mounted {} on {} ({})", w.name, m.path.display(), m.door);
            }
        }
        Ok(())
    }

    pub fn mount(&self, args: MountArgs) -> Result<(), String> {
        let request = Request::Mount {
            name: args.name,
            path: absolute(&args.path)?,
            door: args.door.door(),
        };
        if let Some(w) = self.call::<WorkspaceInfo>(request)? {
            if let Some(m) = &w.mount {
                println!("mounted {} on {} ({})", w.name, m.path.display(), m.door);
            }
        }
        Ok(())
    }

    pub fn unmount(&self, args: UnmountArgs) -> Result<(), String> {
        // A mount point is sent as the absolute path it was mounted on.
        let target = match Path::new(&args.target).canonicalize() {
            Ok(path) if args.target.contains('/') => path.to_string_lossy().into_owned(),
            _ => args.target,
        };
        if let Some(w) = self.call::<WorkspaceInfo>(Request::Unmount { target })? {
            println!("unmounted {}", w.name);
        }
        Ok(())
    }

    pub fn commit(&self, args: CommitArgs) -> Result<(), String> {
        let request = Request::Commit {
            name: args.name,
            message: args.message,
        };
        if let Some(layer) = self.call::<LayerInfo>(request)? {
            println!("{}", layer.id);
        }
        Ok(())
    }

    pub fn diff(&self, args: DiffArgs) -> Result<(), String> {
        let request = Request::Diff { name: args.name };
        if let Some(changes) = self.call::<Vec<DiffEntry>>(request)? {
            let mut out = io::stdout().lock();
            for c in changes {
                let _ = match c.changed.is_empty() {
                    true => writeln!(out, "{} {}", c.kind, c.path),
                    false => writeln!(out, "{} {} ({})", c.kind, c.path, c.changed.join(",")),
                };
            }
        }
        Ok(())
    }

    pub fn set(&self, args: SetArgs) -> Result<(), String> {
        let Some(size) = args.size else {
            return Err("nothing to set: give --size SIZE (or --size none)".into());
        };
        let size = parse_size_or_none(&size)?;
        let request = Request::SetSize {
            name: args.name,
            size,
        };
        if let Some(w) = self.call::<WorkspaceInfo>(request)? {
            match w.size_limit {
                Some(limit) => println!("{}: size limit {}", w.name, human(limit)),
                None => println!("{}: no size limit", w.name),
            }
        }
        Ok(())
    }

    pub fn reset(&self, args: ResetArgs) -> Result<(), String> {
        let name = args.name.clone();
        let request = Request::Reset {
            name: args.name,
            paths: args.paths,
        };
        if let Some(changed) = self.call::<usize>(request)? {
            println!("reset {name}: {changed} names back to the layers'");
        }
        Ok(())
    }

    pub fn ls(&self) -> Result<(), String> {
        if let Some(all) = self.call::<Vec<WorkspaceInfo>>(Request::Ls)? {
            let mut out = io::stdout().lock();
            let _ = writeln!(
                out,
                "{:<20} {:>6}  {:<10} {:>15} {:>6}  MOUNT",
                "NAME", "LAYERS", "STATE", "SIZE USED/LIMIT", "LOCAL"
            );
            for w in all {
                let mount = w
                    .mount
                    .map(|m| format!("{} ({})", m.path.display(), m.door))
                    .unwrap_or_default();
                let size = match (w.size_used, w.size_limit) {
                    (Some(used), Some(limit)) => format!("{}/{}", human(used), human(limit)),
                    (None, Some(limit)) => format!("-/{}", human(limit)),
                    _ => "-".into(),
                };
                let local = crate::images::local_share(w.local);
                let _ = writeln!(
                    out,
                    "{:<20} {:>6}  {:<10} {size:>15} {local:>6}  {mount}",
                    w.name,
                    w.layers.len(),
                    w.state
                );
            }
        }
        Ok(())
    }

    pub fn rm(&self, args: RmArgs) -> Result<(), String> {
        let request = Request::Rm {
            name: args.name,
            force: args.force,
        };
        if let Some(name) = self.call::<String>(request)? {
            println!("removed {name}");
        }
        Ok(())
    }

    pub fn stats(&self) -> Result<(), String> {
        let Some(s) = self.call::<Stats>(Request::Stats)? else {
            return Ok(());
        };
        let per = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        println!("NFS server on {}", s.nfs);
        let t = &s.transport;
        println!("connections      {}", t.connections);
        println!(
            "records          {} ({:.2} socket reads per record)",
            t.records,
            per(t.socket_reads, t.records)
        );
        println!(
            "replies          {} ({:.2} socket writes per reply)",
            t.replies,
            per(t.socket_writes, t.replies)
        );
        println!("bytes in / out   {} / {}", t.bytes_in, t.bytes_out);
        println!(
            "{:<6} {:<12} {:>10} {:>10} {:>10}",
            "", "procedure", "calls", "p50 (us)", "p99 (us)"
        );
        for p in s.procedures {
            println!(
                "{:<6} {:<12} {:>10} {:>10} {:>10}",
                p.program, p.procedure, p.calls, p.p50_us, p.p99_us
            );
        }
        println!("(times are what each procedure ran, at most 2x the true figure)");
        Ok(())
    }
}

/// Progress bars on the terminal for a request that takes a while (one
/// per part, such as a layer of a pull, and one for the whole); nothing
/// when output is not a terminal or is JSON.
struct ProgressShown {
    enabled: bool,
    started: std::time::Instant,
    bars: Option<Bars>,
}

struct Bars {
    all: indicatif::MultiProgress,
    parts: Vec<indicatif::ProgressBar>,
    total: indicatif::ProgressBar,
}

/// A request quicker than this shows no bar.
const BAR_AFTER: Duration = Duration::from_millis(500);

impl ProgressShown {
    fn new(enabled: bool) -> ProgressShown {
        ProgressShown {
            enabled,
            started: std::time::Instant::now(),
            bars: None,
        }
    }

    fn show(&mut self, p: Progress) {
        if !self.enabled || (self.bars.is_none() && self.started.elapsed() < BAR_AFTER) {
            return;
        }
        let bars = self.bars.get_or_insert_with(|| {
            let all = indicatif::MultiProgress::new();
            let total = bar(
                "{prefix:<13} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                p.total,
            );
            if !p.parts.is_empty() {
                total.set_prefix("total");
            }
            let total = all.add(total);
            Bars {
                all,
                parts: Vec::new(),
                total,
            }
        });
        for (i, part) in p.parts.iter().enumerate() {
            if i == bars.parts.len() {
                let shown = bar("{prefix:<13} [{bar:40}] {bytes}/{total_bytes}", part.total);
                shown.set_prefix(short_digest(&part.name));
                bars.parts.push(bars.all.insert_before(&bars.total, shown));
            }
            bars.parts[i].set_length(part.total);
            bars.parts[i].set_position(part.done);
        }
        bars.total.set_length(p.total);
        bars.total.set_position(p.done);
    }
}

fn bar(template: &str, length: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(length);
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// `sha256:0123456789ab...` as `0123456789ab`, as registries' tools show it.
fn short_digest(name: &str) -> String {
    let hex = name.split_once(':').map_or(name, |(_, hex)| hex);
    hex.chars().take(12).collect()
}

impl Drop for ProgressShown {
    fn drop(&mut self) {
        if let Some(bars) = self.bars.take() {
            for bar in bars.parts.iter().chain([&bars.total]) {
                bar.finish_and_clear();
            }
            let _ = bars.all.clear();
        }
    }
}

fn print_json(value: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}

fn print_layers(layers: &[LayerInfo]) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{:<16} {:<24} MESSAGE", "LAYER", "USED BY");
    for l in layers {
        let message = match (&l.message, &l.workspace) {
            (Some(m), _) => m.clone(),
            (None, Some(w)) => format!("(commit of {w})"),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<16} {:<24} {message}",
            &l.id[..l.id.len().min(16)],
            l.used_by.join(",")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
        for bad in ["", "M", "12X", "-1", "0", "1e99"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_size_or_none("none"), Ok(None));
        assert_eq!(human(64 << 20), "64.0M");
        assert_eq!(human(100), "100");
        assert_eq!(
            short_digest(&format!("sha256:{}", "ab".repeat(32))),
            "abababababab"
        );
        assert_eq!(short_digest("layer"), "layer");
    }
}
