//! `layerfs serve`: one directory or stack, in the foreground, over NFS or
//! through FUSE, without a daemon.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use layerfs_layers::StackFs;
use layerfs_rpc::{Admission, ServerConfig};
use layerfs_vfs::{Filesystem, LocalFs};

use crate::interrupted;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on, a loopback one unless --allow-remote. Port 0
    /// lets the OS pick a free port. On Linux only the kernel's NFS client
    /// (root's sockets) and the user running layerfs may connect: NFSv3's
    /// AUTH_SYS trusts whatever uid a client claims.
    #[arg(
        long,
        default_value = "127.0.0.1:0",
        value_name = "ADDR",
        conflicts_with = "fuse"
    )]
    pub listen: SocketAddr,
    /// Take every NFS caller to be UID:GID (with no other groups), whatever
    /// uid its credential claims: files are made as that user and every
    /// permission is checked for it.
    #[arg(long, value_name = "UID:GID", value_parser = parse_squash, conflicts_with = "fuse")]
    squash: Option<(u32, u32)>,
    /// Allow --listen on an address other hosts can reach. Any host that
    /// can connect can then act as any user: only on a network you trust.
    #[arg(long, conflicts_with = "fuse")]
    allow_remote: bool,
    /// Mount through FUSE at PATH (an empty directory) instead of serving
    /// NFS. Root mounts directly; other users need fusermount3 (Debian: the
    /// fuse3 package). Only the user who mounts can reach the mount unless
    /// --allow-other is given.
    #[arg(long, value_name = "PATH")]
    pub fuse: Option<PathBuf>,
    /// With --fuse: let every user reach the mount (FUSE's allow_other;
    /// a user who is not root needs user_allow_other in /etc/fuse.conf).
    /// Permissions are still checked per caller.
    #[arg(long, requires = "fuse")]
    allow_other: bool,
    /// With --fuse: send every read and write of a file through layerfs
    /// rather than let the kernel do them on the file's host file (FUSE
    /// passthrough, otherwise used when layerfs runs as root on a kernel
    /// that offers it). Slower; for tracing I/O, or a kernel whose
    /// passthrough misbehaves.
    #[arg(long, requires = "fuse")]
    no_passthrough: bool,
    /// With --fuse: take the kernel's requests through FUSE over io_uring,
    /// where it offers that (Linux 6.14+ with the fuse module's
    /// enable_uring parameter set; layerfs run as root): each CPU's
    /// requests are answered by a thread on that CPU, which saves waking
    /// one on another. Otherwise, or if the rings cannot be set up,
    /// requests come through /dev/fuse as without it.
    #[arg(long, requires = "fuse")]
    io_uring: bool,
    /// Calls in flight per connection before the server stops reading more from it.
    #[arg(long, default_value_t = ServerConfig::default().window, value_name = "N")]
    window: usize,
    /// Seconds a client has to send the rest of a call once its first byte
    /// arrived; a slower one is disconnected.
    #[arg(long, default_value_t = ServerConfig::default().record_deadline.as_secs(), value_name = "SECS")]
    record_deadline: u64,
    /// Seconds without a call after which a client's connection is closed
    /// (it reconnects when it needs to).
    #[arg(long, default_value_t = ServerConfig::default().idle_timeout.as_secs(), value_name = "SECS")]
    idle_timeout: u64,
    /// Connections open at most (each holds a thread); past it the one idle
    /// the longest is closed to make room.
    #[arg(long, default_value_t = ServerConfig::default().max_connections, value_name = "N")]
    max_connections: usize,
    /// Microseconds a CPU is kept awake at the lowest priority after a reply
    /// of under 256 KiB leaves for a client that was waiting for it (nothing
    /// else in flight or queued), so that its next call finds the CPU running
    /// (a halted vCPU takes tens of microseconds to wake); 0 for never.
    #[arg(long, default_value_t = ServerConfig::default().stay_awake.as_micros() as u64, value_name = "MICROS")]
    stay_awake: u64,
    /// Threads that run calls, shared by all connections.
    #[arg(long, default_value_t = ServerConfig::default().workers, value_name = "N")]
    workers: usize,
    /// The directory to export, alone and writable.
    #[arg(required_unless_present = "upper", conflicts_with_all = ["layer", "upper"])]
    dir: Option<PathBuf>,
    /// A read-only layer (a directory with OCI whiteouts: `.wh.NAME`,
    /// `.wh..wh..opq`); repeat for more, bottom first. Needs --upper.
    #[arg(long, value_name = "DIR", requires = "upper")]
    layer: Vec<PathBuf>,
    /// The writable layer on top of the --layer ones, where every change
    /// goes; made if missing. It also keeps the workspace's inode map, in
    /// a directory clients never see.
    #[arg(long, value_name = "DIR")]
    upper: Option<PathBuf>,
}

/// An existing directory, as an absolute path.
fn existing_dir(path: &Path) -> Result<PathBuf, String> {
    let dir = path
        .canonicalize()
        .map_err(|e| format!("cannot export {}: {e}", path.display()))?;
    if !dir.is_dir() {
        return Err(format!("cannot export {}: not a directory", dir.display()));
    }
    Ok(dir)
}

/// The filesystem to serve, the directory it is known by, and what it is.
fn filesystem(args: &ServeArgs) -> Result<(Arc<dyn Filesystem>, PathBuf, String), String> {
    if let Some(upper) = &args.upper {
        let layers = args
            .layer
            .iter()
            .map(|l| existing_dir(l))
            .collect::<Result<Vec<_>, _>>()?;
        let fs = StackFs::open_in_upper(&layers, upper)
            .map_err(|e| format!("cannot serve the stack on {}: {e}", upper.display()))?;
        let upper = existing_dir(upper)?;
        let plural = if layers.len() == 1 { "" } else { "s" };
        let what = format!(
            "{} read-only layer{plural} under {}",
            layers.len(),
            upper.display()
        );
        return Ok((Arc::new(fs), upper, what));
    }
    let dir = existing_dir(args.dir.as_deref().expect("clap requires DIR or --upper"))?;
    let fs = LocalFs::open(&dir).map_err(|e| format!("cannot export {}: {e}", dir.display()))?;
    let what = dir.display().to_string();
    Ok((Arc::new(fs), dir, what))
}

/// The key that signs the export's handles, kept where handles must outlive
/// a restart: with a stack's state in its upper, or for a plain directory in
/// the user's store directory (shared by every directory served).
fn handle_key(args: &ServeArgs) -> Result<layerfs_nfs::HandleKey, String> {
    let path = match &args.upper {
        Some(upper) => upper
            .join(layerfs_layers::STATE_IN_UPPER)
            .join("handle.key"),
        None => match layerfs_daemon::paths::default_store() {
            Ok(store) => {
                std::fs::create_dir_all(&store)
                    .map_err(|e| format!("cannot make {}: {e}", store.display()))?;
                store.join("handle.key")
            }
            Err(e) => {
                tracing::warn!("{e}: file handles will not survive a restart of this server");
                return layerfs_nfs::HandleKey::random().map_err(|e| e.to_string());
            }
        },
    };
    layerfs_nfs::HandleKey::load_or_create(&path).map_err(|e| e.to_string())
}

fn parse_squash(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text
        .split_once(':')
        .ok_or_else(|| format!("{text}: give UID:GID, such as 1000:1000"))?;
    let number = |n: &str| n.parse::<u32>().map_err(|e| format!("{n}: {e}"));
    Ok((number(uid)?, number(gid)?))
}

#[cfg(target_os = "linux")]
pub fn serve_fuse(args: ServeArgs) -> Result<(), String> {
    use layerfs_fuse::{Caching, Options};
    let mountpoint = args.fuse.clone().expect("serve_fuse needs --fuse");
    let (fs, _dir, what) = filesystem(&args)?;
    let options = Options {
        // A stack's layers never change and its upper is served by this
        // process alone; a plain directory may be changed by anyone.
        caching: if args.upper.is_some() {
            Caching::Exclusive
        } else {
            Caching::Shared
        },
        allow_other: args.allow_other,
        // One per core.
        threads: 0,
        passthrough: !args.no_passthrough,
        source: "layerfs".into(),
        io_uring: args.io_uring,
    };
    let stop = interrupted()?;
    let mounted = layerfs_fuse::mount(fs, &mountpoint, &options).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let banner = format!(
        "mounted on {}\nserving {what}\nstop with Ctrl-C (or fusermount3 -u {})\n",
        mounted.mountpoint().display(),
        mounted.mountpoint().display(),
    );
    out.write_all(banner.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(out);
    // Ends on a signal, or when the mount is taken away from outside.
    while mounted.is_serving() {
        match stop.recv_timeout(std::time::Duration::from_millis(250)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    tracing::info!("unmounting");
    mounted
        .unmount()
        .map_err(|e| format!("cannot unmount: {e}"))
}

#[cfg(not(target_os = "linux"))]
pub fn serve_fuse(_args: ServeArgs) -> Result<(), String> {
    Err("--fuse is available on Linux only; use NFS (without --fuse) here".into())
}

pub fn serve(args: ServeArgs) -> Result<(), String> {
    if !args.listen.ip().is_loopback() {
        if !args.allow_remote {
            return Err(format!(
                "{} is not a loopback address: other hosts could connect and act as any \
                 user; give --allow-remote to serve it anyway",
                args.listen.ip()
            ));
        }
        tracing::warn!(
            "serving on {}: any host that can reach it can act as any user of the export",
            args.listen
        );
    }
    let (fs, dir, what) = filesystem(&args)?;
    let host_path = dir.as_os_str().as_encoded_bytes();
    let config = ServerConfig {
        window: args.window,
        workers: args.workers,
        // The kernel's client connects from root's sockets; this user's own
        // tools (libnfs, tests) from theirs. Other local users are refused.
        admit: Admission::Uids(vec![0, rustix::process::geteuid().as_raw()]),
        record_deadline: Duration::from_secs(args.record_deadline.max(1)),
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        max_connections: args.max_connections.max(1),
        stay_awake: Duration::from_micros(args.stay_awake),
    };
    let stop = interrupted()?;
    let mut export = layerfs_nfs::Export::new(fs, host_path)
        .map_err(|e| format!("cannot export {}: {e}", dir.display()))?;
    export.squash = args.squash;
    export.key = handle_key(&args)?;
    let mut server = layerfs_nfs::serve_export(export, args.listen, config)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let addr = server.local_addr();
    let port = addr.port();
    let ip = addr.ip();
    let linux = layerfs_nfs::mount_options::linux(ip, port);
    let macos = layerfs_nfs::mount_options::macos(port);
    let mut out = std::io::stdout().lock();
    let banner = format!(
        "listening on {addr}\n\
         exporting {what} as /\n\
         mount it from Linux (as root):\n  \
         mount -t nfs -o {linux} {ip}:/ /mnt/layerfs\n\
         mount it from macOS:\n  \
         mount -t nfs -o {macos} {ip}:/ ~/layerfs\n\
         stop with Ctrl-C\n",
    );
    out.write_all(banner.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(out);
    let _ = stop.recv();
    tracing::info!("stopping");
    server.stop();
    Ok(())
}
