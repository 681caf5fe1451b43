//! A mount served by the door: started on a new connection or resumed on a
//! kept one, served on its threads and rings, and taken down.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerfs_vfs::{FileId, Filesystem};

use crate::abi::init;
use crate::attrs::Inos;
use crate::backing::Backing;
use crate::connection::{Connection, Wants};
use crate::devfuse::Readers;
use crate::door::Door;
use crate::handover::{self, Kept};
use crate::mounting::{self, MountAs};
use crate::opens::OpenFiles;

pub use crate::attrs::Caching;

/// How to mount.
#[derive(Clone, Debug)]
pub struct Options {
    pub caching: Caching,
    /// Let every user reach the mount (FUSE's `allow_other`), not only the
    /// one who mounted it. Off unless asked: the door runs every request with
    /// its own privileges after checking the caller, and a mount others
    /// cannot reach is one less way in.
    pub allow_other: bool,
    /// Threads answering the kernel; 0 for one per core.
    pub threads: usize,
    /// Let the kernel read and write host files itself (FUSE passthrough)
    /// where it offers that and the door runs as root; otherwise every read
    /// and write is a request to the door.
    pub passthrough: bool,
    /// The name the mount table shows as the source.
    pub source: String,
    /// Serve through FUSE over io_uring where the kernel offers it (its
    /// `fuse.enable_uring` parameter, off by default): each CPU's requests
    /// are answered on that CPU (docs/architecture/engine/kernel-routes/fuse.md).
    pub io_uring: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            caching: Caching::Shared,
            allow_other: false,
            threads: 0,
            passthrough: true,
            source: "layerfs".into(),
            io_uring: false,
        }
    }
}

/// A mounted filesystem; [`Mounted::unmount`] (or dropping it) takes it down.
pub struct Mounted {
    /// The threads reading `/dev/fuse`.
    readers: Option<Readers>,
    mountpoint: PathBuf,
    connection: Arc<Connection>,
    shared: Shared,
}

/// Mounts `fs` at `mountpoint` and serves it on background threads.
///
/// Fails with a one-line reason when FUSE cannot be used here: no
/// `/dev/fuse`, a missing or non-empty mount point, or no `fusermount3` for
/// a user who is not root.
pub fn mount(fs: Arc<dyn Filesystem>, mountpoint: &Path, options: &Options) -> io::Result<Mounted> {
    let mountpoint = mounting::usable_mountpoint(mountpoint)?;
    mounting::usable_fuse()?;
    let how = MountAs {
        source: options.source.clone(),
        allow_other: options.allow_other,
    };
    let device = mounting::mount(&mountpoint, &how)?;
    let connection = match Connection::start(device, wants(options)) {
        Ok(connection) => Arc::new(connection),
        Err(e) => {
            let _ = mounting::detach(&mountpoint);
            return Err(io::Error::new(
                e.kind(),
                format!("FUSE on {}: {e}", mountpoint.display()),
            ));
        }
    };
    let door = Door::answering(fs, options.caching, connection.clone());
    door.adopt_removed();
    let mounted = match Mounted::serve(door, connection, options, mountpoint.clone()) {
        Ok(mounted) => mounted,
        Err(e) => {
            // Served by nobody, the mount would fail its users (ENOTCONN).
            let _ = mounting::detach(&mountpoint);
            return Err(e);
        }
    };
    // Served first: it asks the mount for its device.
    mounting::widen_readahead(&mounted.mountpoint);
    Ok(mounted)
}

/// Serves `fs` through the live session `kept`, mounted at `mountpoint` by
/// another process that is gone (see [`crate::handover`]): the mount stays
/// as it is, and requests the kernel holds for it are answered from now.
pub fn resume(
    fs: Arc<dyn Filesystem>,
    mountpoint: &Path,
    kept: Kept,
    options: &Options,
) -> io::Result<Mounted> {
    // The last server's INIT kept FUSE over io_uring only if it served the
    // rings; once they serve, the kernel sends this connection's requests
    // nowhere else, so this server serves them too, whatever it was asked.
    let options = Options {
        io_uring: kept.kernel.flags & init::OVER_IO_URING != 0,
        ..options.clone()
    };
    let connection = Arc::new(Connection::resume(
        kept.device,
        kept.kernel,
        wants(&options),
    ));
    let door = Door::answering(fs, options.caching, connection.clone());
    let adopted = kept
        .opens
        .ok_or_else(|| io::Error::other("the last server left none"))
        .and_then(|table| open_files(connection.device(), table));
    let door = match adopted {
        Ok(opens) => door.with_open_files(opens),
        Err(e) => {
            tracing::warn!(
                "{}: no open-file table ({e}): a file the last server passed through \
                 and that is still open cannot be opened again until it is closed",
                mountpoint.display()
            );
            door
        }
    };
    door.adopt_removed();
    let mounted = Mounted::serve(door, connection, &options, mountpoint.to_path_buf())?;
    match handover::ask_resend(&**mounted.connection.device()) {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "{}: this kernel cannot send again the requests the last server had read \
             (FUSE_NOTIFY_RESEND, Linux 6.9): their callers wait until killed",
            mountpoint.display()
        ),
        Err(e) => tracing::warn!("{}: asking for requests again: {e}", mountpoint.display()),
    }
    if options.io_uring {
        // The rings of the last server ended with it. What it had taken
        // from them and not answered, the kernel does not send again (it
        // resends only what was read from /dev/fuse).
        crate::uring::wake_queues(&mounted.mountpoint);
    }
    Ok(mounted)
}

/// What a door serving with `options` asks of the kernel.
fn wants(options: &Options) -> Wants {
    Wants {
        caching: options.caching,
        passthrough: options.passthrough && rustix::process::geteuid().is_root(),
        rings: options.io_uring,
    }
}

/// Serves `connection` on the process's rings, where it agreed to FUSE
/// over io_uring; else, said once per process, through `/dev/fuse` alone.
fn join_rings(connection: &Connection, template: &Door) {
    if !connection.agreed().rings() {
        static SAID: std::sync::Once = std::sync::Once::new();
        return SAID.call_once(|| {
            tracing::warn!(
                "the kernel does not offer FUSE over io_uring (Linux 6.14+, with \
                 /sys/module/fuse/parameters/enable_uring set to Y): requests come \
                 through /dev/fuse"
            )
        });
    }
    match crate::uring::join(connection.device(), || template.sibling()) {
        Ok(()) => tracing::info!("requests come through FUSE over io_uring"),
        Err(e) => {
            tracing::warn!("FUSE over io_uring not set up ({e}): requests come through /dev/fuse")
        }
    }
}

/// The open files the last server of the session recorded in `table`, their
/// backing files registered on `device`'s connection.
fn open_files(device: &Arc<OwnedFd>, table: OwnedFd) -> io::Result<OpenFiles<Backing>> {
    let (table, rows) = crate::open_table::OpenTable::adopt(table)?;
    let passed = rows.iter().filter(|(_, row)| row.passthrough > 0).count();
    if !rows.is_empty() {
        tracing::info!(
            open = rows.len(),
            passthrough = passed,
            "inodes open across the hand-over, served as before"
        );
    }
    Ok(OpenFiles::resume(table, rows, |id| {
        Backing::adopt(device, id)
    }))
}

/// What the mount's owner keeps of its door.
struct Shared {
    opens: Arc<OpenFiles<Backing>>,
    no_caps: Arc<crate::door::NoCaps>,
    inos: Inos,
    routes: Arc<crate::routes::Routes>,
}

impl Shared {
    fn of(door: &Door) -> Shared {
        Shared {
            opens: door.open_files(),
            no_caps: door.no_caps(),
            inos: door.inos(),
            routes: door.routes(),
        }
    }
}

impl Mounted {
    /// Serves `connection` with `door` (and its siblings): on the rings
    /// where it agreed to them, and through `/dev/fuse`.
    fn serve(
        door: Door,
        connection: Arc<Connection>,
        options: &Options,
        mountpoint: PathBuf,
    ) -> io::Result<Mounted> {
        if options.io_uring {
            join_rings(&connection, &door);
        }
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let shared = Shared::of(&door);
        // A descriptor of its own per thread, but for one thread the
        // connection's own: then every request is read through the
        // descriptor a keeper holds a copy of (a clone closed with a dead
        // server fails its requests).
        let device = connection.device().try_clone()?;
        let readers = Readers::start(&device, Arc::new(door), threads, threads > 1)?;
        Ok(Mounted {
            readers: Some(readers),
            mountpoint,
            connection,
            shared,
        })
    }

    /// A copy of the connection's device and what its INIT offered: given
    /// to a process that outlives this one, it keeps the mount alive, and
    /// [`resume`] serves it again (see [`crate::handover`]).
    pub fn kept(&self) -> io::Result<Kept> {
        Ok(Kept {
            device: self.connection.device().try_clone()?,
            kernel: self.connection.kernel(),
            opens: self.shared.opens.table(),
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts, lazily if the mount is busy (it goes once the last user
    /// leaves), and stops the threads serving it.
    pub fn unmount(mut self) -> io::Result<()> {
        self.take_down()
    }

    /// Stops answering without unmounting, for a process about to exit
    /// whose keeper holds the session for the next server: what the
    /// threads serving it have read and not answered by then is sent
    /// again to that server.
    pub fn leave(mut self) {
        // The threads end with the process (joining would wait for the
        // next request); nothing is unmounted.
        self.readers.take();
    }

    /// The files the kernel writes itself (passthrough opens), with no
    /// request to the door: a filesystem that must see every change (a
    /// commit) has to treat them as written at any moment.
    pub fn written_directly(&self) -> Vec<FileId> {
        self.shared.opens.passed_through()
    }

    /// Sends the kernel's dirty pages of this mount (a writeback cache) to
    /// the door now: what a process wrote before this call is then in the
    /// filesystem.
    pub fn flush(&self) -> io::Result<()> {
        let root = std::fs::File::open(&self.mountpoint)?;
        rustix::fs::syncfs(&root)?;
        Ok(())
    }

    /// Tells the kernel to drop what it keeps of the entries `names` (a
    /// directory's id and a name in it) and of the attributes and pages of
    /// `files`: what changed behind its back (a reset). What the kernel
    /// does not hold is no error.
    pub fn invalidate(&self, names: &[(FileId, Vec<u8>)], files: &[FileId]) {
        self.shared.no_caps.forget();
        for (dir, name) in names {
            let _ = self
                .connection
                .forget_entry(self.shared.inos.ino(*dir).0, name);
        }
        for id in files {
            let _ = self
                .connection
                .forget_inode(self.shared.inos.ino(*id).0, true);
        }
    }

    /// Whether the kernel still sends requests: false once the mount was
    /// taken away from outside (`umount`, `fusermount3 -u`).
    pub fn is_serving(&self) -> bool {
        self.readers.as_ref().is_some_and(|r| !r.is_finished())
    }

    fn take_down(&mut self) -> io::Result<()> {
        let Some(readers) = self.readers.take() else {
            return Ok(());
        };
        if !connected(self.connection.device()) {
            // Unmounted from outside (or aborted): nothing of this mount is
            // left, and unmounting its path now could take what was mounted
            // there since, a restarted door's mount, say.
            self.say_routes("was unmounted");
            return Ok(());
        }
        match mounting::unmount(&self.mountpoint) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                // In use: detached now, gone once its last user leaves,
                // served until then.
                tracing::warn!("{} is busy: detached", self.mountpoint.display());
                mounting::detach(&self.mountpoint)
            }
            Err(e) => Err(e),
            Ok(()) => {
                readers.join();
                self.say_routes("unmounted");
                Ok(())
            }
        }
    }

    /// Logs, at the end of the mount, how many requests came by each route.
    fn say_routes(&self, ended: &str) {
        let (device, rings) = self.shared.routes.counted();
        tracing::info!(
            "{} {ended}: {device} requests were answered through /dev/fuse, \
             {rings} through the rings",
            self.mountpoint.display()
        );
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.take_down() {
            tracing::warn!("unmounting {}: {e}", self.mountpoint.display());
        }
    }
}

/// Whether the FUSE connection of `device` still stands: the kernel says
/// POLLERR on its devices once it has ended (an unmount, an abort).
fn connected(device: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(device, PollFlags::empty())];
    loop {
        match poll(&mut fds, Some(&Timespec::default())) {
            Ok(_) => return !fds[0].revents().contains(PollFlags::ERR),
            Err(rustix::io::Errno::INTR) => continue,
            // Not known to be gone: taken down as a live mount is.
            Err(_) => return true,
        }
    }
}
