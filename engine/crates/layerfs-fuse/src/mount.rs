//! Mounting a filesystem through the door, and taking it down.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{Config, MountOption, SessionACL};
use layerfs_vfs::{FileId, Filesystem};
use rustix::fs::Access;

use crate::abi::OVER_IO_URING;
use crate::attrs::Inos;
use crate::backing::Backing;
use crate::devfuse::Readers;
use crate::door::Door;
use crate::handover::{self, Kept, KernelInit};
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
    /// fuser's session, once its INIT is answered: kept for the unmount
    /// (fuser mounted it, through `fusermount3` for a user), never run.
    session: Option<fuser::Session<Door>>,
    /// The threads reading `/dev/fuse`.
    readers: Option<Readers>,
    mountpoint: PathBuf,
    shared: Shared,
    /// A copy of the session's device descriptor, for [`Mounted::kept`].
    device: OwnedFd,
    /// Taken over from another process: fuser did not mount it, so it
    /// cannot unmount it either.
    resumed: bool,
}

/// Mounts `fs` at `mountpoint` and serves it on background threads.
///
/// Fails with a one-line reason when FUSE cannot be used here: no
/// `/dev/fuse`, a missing or non-empty mount point, or no `fusermount3` for
/// a user who is not root.
pub fn mount(fs: Arc<dyn Filesystem>, mountpoint: &Path, options: &Options) -> io::Result<Mounted> {
    let mountpoint = usable_mountpoint(mountpoint)?;
    usable_fuse()?;
    let (door, config) = door(fs, options);
    door.adopt_removed();
    let shared = Shared::of(&door);
    let template = door.sibling();
    let session = fuser::Session::new(door, &mountpoint, &config.fuser).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot mount on {}: {e}", mountpoint.display()),
        )
    })?;
    let device = shared.device_of(&session)?;
    if options.io_uring {
        let kernel = *shared.kernel.lock();
        join_rings(&device, kernel, &template);
    }
    let mounted = Mounted::serve(session, &config, &template, mountpoint, shared, false)?;
    // Served first: it asks the mount for its device.
    widen_readahead(&mounted.mountpoint);
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
    let rings = kept.kernel.flags & OVER_IO_URING != 0;
    let options = Options {
        io_uring: rings,
        ..options.clone()
    };
    let (door, config) = door(fs, &options);
    let adopted = kept
        .opens
        .ok_or_else(|| io::Error::other("the last server left none"))
        .and_then(|table| open_files(&kept.device, table));
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
    let shared = Shared::of(&door);
    let template = door.sibling();
    let kernel = kept.kernel;
    let session = handover::start(door, kept.device, kernel, config.fuser.clone())?;
    let mounted = Mounted::serve(
        session,
        &config,
        &template,
        mountpoint.to_path_buf(),
        shared,
        true,
    )?;
    match handover::ask_resend(&mounted.device) {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "{}: this kernel cannot send again the requests the last server had read \
             (FUSE_NOTIFY_RESEND, Linux 6.9): their callers wait until killed",
            mountpoint.display()
        ),
        Err(e) => tracing::warn!("{}: asking for requests again: {e}", mountpoint.display()),
    }
    if rings {
        // The rings of the last server ended with it. What it had taken
        // from them and not answered, the kernel does not send again (it
        // resends only what was read from /dev/fuse).
        join_rings(&mounted.device, Some(kernel), &template);
        crate::uring::wake_queues(&mounted.mountpoint);
    }
    Ok(mounted)
}

/// Serves the connection of `device` on the process's rings, if its INIT
/// (`kernel`) offered FUSE over io_uring (the door then agreed to it);
/// else, said once per process, through `/dev/fuse` alone.
fn join_rings(device: &OwnedFd, kernel: Option<KernelInit>, template: &Door) {
    if kernel.is_none_or(|k| k.flags & OVER_IO_URING == 0) {
        static SAID: std::sync::Once = std::sync::Once::new();
        return SAID.call_once(|| {
            tracing::warn!(
                "the kernel does not offer FUSE over io_uring (Linux 6.14+, with \
                 /sys/module/fuse/parameters/enable_uring set to Y): requests come \
                 through /dev/fuse"
            )
        });
    }
    match crate::uring::join(device, || template.sibling()) {
        Ok(()) => tracing::info!("requests come through FUSE over io_uring"),
        Err(e) => {
            tracing::warn!("FUSE over io_uring not set up ({e}): requests come through /dev/fuse")
        }
    }
}

/// The open files the last server of the session recorded in `table`, their
/// backing files registered on `device`'s connection.
fn open_files(device: &OwnedFd, table: OwnedFd) -> io::Result<OpenFiles<Backing>> {
    let (table, rows) = crate::open_table::OpenTable::adopt(table)?;
    let device = Arc::new(device.try_clone()?);
    let passed = rows.iter().filter(|(_, row)| row.passthrough > 0).count();
    if !rows.is_empty() {
        tracing::info!(
            open = rows.len(),
            passthrough = passed,
            "inodes open across the hand-over, served as before"
        );
    }
    Ok(OpenFiles::resume(table, rows, |id| {
        Backing::adopt(&device, id)
    }))
}

/// How a mount is served besides its door.
struct Serving {
    /// fuser's settings, for the mount and the INIT.
    fuser: Config,
    /// Threads reading `/dev/fuse`.
    threads: usize,
    /// Whether each thread but the first reads a clone of the device.
    clone: bool,
}

/// The door for `fs` and how to serve it.
fn door(fs: Arc<dyn Filesystem>, options: &Options) -> (Door, Serving) {
    static LARGE_BUFFERS_MAPPED: std::sync::Once = std::sync::Once::new();
    LARGE_BUFFERS_MAPPED.call_once(map_large_buffers);
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(options.source.clone()),
        MountOption::Subtype("layerfs".into()),
        MountOption::NoSuid,
        MountOption::NoDev,
        // The kernel checks permission on every path walk, open and
        // change against the attributes it holds (with the caller's own
        // groups), before it asks the door: without it, a name the kernel
        // has cached is reached with no search permission checked, and
        // FIFOs and O_TRUNC are not checked at all. The door checks again.
        MountOption::DefaultPermissions,
    ];
    config.acl = if options.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    let door = Door::new(fs, options.caching, options.passthrough).with_uring(options.io_uring);
    let serving = Serving {
        fuser: config,
        threads,
        // A descriptor of its own per thread, but for one thread the
        // session's own: then every request is read through the descriptor
        // a keeper holds a copy of (a clone closed with a dead server fails
        // its requests).
        clone: threads > 1,
    };
    (door, serving)
}

/// What the mount's owner keeps of the door once the session has it.
struct Shared {
    opens: Arc<OpenFiles<Backing>>,
    no_caps: Arc<crate::door::NoCaps>,
    kernel: Arc<parking_lot::Mutex<Option<KernelInit>>>,
    inos: Inos,
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
    device: Arc<std::sync::OnceLock<Arc<OwnedFd>>>,
    routes: Arc<crate::routes::Routes>,
}

impl Shared {
    /// The session's device, kept for the door to register backing files
    /// on (the first call sets it).
    fn device_of(&self, session: &fuser::Session<Door>) -> io::Result<Arc<OwnedFd>> {
        if let Some(device) = self.device.get() {
            return Ok(device.clone());
        }
        let device = Arc::new(session.as_fd().try_clone_to_owned()?);
        Ok(self.device.get_or_init(|| device).clone())
    }

    fn of(door: &Door) -> Shared {
        Shared {
            opens: door.open_files(),
            no_caps: door.no_caps(),
            kernel: door.kernel_init(),
            inos: door.inos(),
            notifier: door.notifier(),
            device: door.device(),
            routes: door.routes(),
        }
    }
}

/// Lets the kernel read ahead as much as one READ may carry.
///
/// A FUSE mount starts with the kernel's default readahead, 128 KiB, which
/// cuts a sequential read of a file the door serves (a lower file) into
/// READs of that size, each a round trip: measured, a cold 512 MiB read
/// took 0.46 s at 128 KiB and 0.23 s at 1 MiB (tmpfs layer, 0.085 s read
/// directly). The window is a setting of the mount's own backing device,
/// which only root may change; elsewhere the default stays.
fn widen_readahead(mountpoint: &Path) {
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let dev = match rustix::fs::stat(mountpoint) {
        Ok(st) => st.st_dev,
        Err(e) => return tracing::debug!("readahead left as it is: {e}"),
    };
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let setting = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    // As large as one READ, and as a READ spliced whole.
    let kib = crate::limits::largest_read() / 1024;
    if let Err(e) = std::fs::write(&setting, kib.to_string()) {
        tracing::debug!("readahead left as it is: {setting}: {e}");
    }
}

/// Each thread serving a session zeroes a read buffer of over 1 MiB (the
/// largest WRITE and its headers, [`crate::devfuse`]), of which a request
/// touches what it holds. Once a buffer that large is freed, glibc raises its threshold for
/// mapping allocations to that size and serves the next ones from a heap,
/// where zeroing touches every page: measured, 50 mounts of the daemon took
/// 1 GB resident and kept 400 MB after their unmount. A fixed threshold
/// keeps each such buffer a mapping of its own, resident only where used
/// and returned whole when freed.
#[allow(unsafe_code)]
fn map_large_buffers() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt takes two integers and changes a setting of the
        // allocator, which glibc makes safe to call at any time.
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
        if set != 1 {
            tracing::debug!("glibc kept its mapping threshold");
        }
    }
}

impl Mounted {
    /// Serves `session`, whose INIT was answered, with a door like
    /// `template` (made now, it passes files through if INIT agreed to).
    fn serve(
        session: fuser::Session<Door>,
        serving: &Serving,
        template: &Door,
        mountpoint: PathBuf,
        shared: Shared,
        resumed: bool,
    ) -> io::Result<Mounted> {
        let device = shared.device_of(&session)?.try_clone()?;
        let _ = shared.notifier.set(session.notifier());
        let door = Arc::new(template.sibling());
        let readers = Readers::start(&device, door, serving.threads, serving.clone)?;
        Ok(Mounted {
            session: Some(session),
            readers: Some(readers),
            mountpoint,
            shared,
            device,
            resumed,
        })
    }

    /// A copy of the session's device and what its INIT said: given to a
    /// process that outlives this one, it keeps the mount alive, and
    /// [`resume`] serves it again (see [`crate::handover`]).
    pub fn kept(&self) -> io::Result<Kept> {
        let kernel = (*self.shared.kernel.lock()).ok_or_else(|| {
            io::Error::other("the session has no FUSE_INIT yet: nothing to hand over")
        })?;
        Ok(Kept {
            device: self.device.try_clone()?,
            kernel,
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
        // next request), and the session is not dropped: it would unmount.
        self.readers.take();
        std::mem::forget(self.session.take());
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
        use std::os::unix::ffi::OsStrExt;
        let Some(notifier) = self.shared.notifier.get() else {
            return;
        };
        self.shared.no_caps.forget();
        for (dir, name) in names {
            let _ = notifier.inval_entry(
                self.shared.inos.ino(*dir),
                std::ffi::OsStr::from_bytes(name),
            );
        }
        for id in files {
            let _ = notifier.inval_inode(self.shared.inos.ino(*id), 0, 0);
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
        let session = self.session.take();
        if !connected(&self.device) {
            // Unmounted from outside (or aborted): nothing of this mount is
            // left, and unmounting its path now could take what was mounted
            // there since, a restarted door's mount, say. fuser's session
            // would unmount the path all the same when dropped (its check
            // for a live connection takes a dead one as live), so it is
            // let go with what it holds (a descriptor or two).
            std::mem::forget(session);
            self.say_routes("was unmounted");
            return Ok(());
        }
        let unmounted = match (self.resumed, session) {
            (false, Some(mut session)) => session.unmount(),
            _ => unmount(&self.mountpoint),
        };
        match unmounted {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                // In use: detached now, gone once its last user leaves,
                // served until then.
                tracing::warn!("{} is busy: detached", self.mountpoint.display());
                detach(&self.mountpoint)
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

/// Unmounts: directly where allowed, else through `fusermount3`.
fn unmount(path: &Path) -> io::Result<()> {
    unmount_with(path, rustix::mount::UnmountFlags::empty())
}

/// Detaches a busy mount: directly where allowed, else through `fusermount3`.
fn detach(path: &Path) -> io::Result<()> {
    unmount_with(path, rustix::mount::UnmountFlags::DETACH)
}

fn unmount_with(path: &Path, flags: rustix::mount::UnmountFlags) -> io::Result<()> {
    match rustix::mount::unmount(path, flags) {
        Err(rustix::io::Errno::PERM) => {
            let lazy = flags.contains(rustix::mount::UnmountFlags::DETACH);
            let mut command = std::process::Command::new("fusermount3");
            if lazy {
                command.args(["-u", "-z", "--"]);
            } else {
                // A refusal is met with a lazy detach: its words are not shown.
                command
                    .args(["-u", "--"])
                    .stderr(std::process::Stdio::null());
            }
            let status = command.arg(path).status()?;
            if status.success() {
                Ok(())
            } else if lazy {
                Err(io::Error::other(format!(
                    "fusermount3 -u -z {} failed: {status}",
                    path.display()
                )))
            } else {
                // fusermount3 says why only in words; busy is the usual
                // reason, and the caller detaches lazily on it.
                Err(io::Error::from_raw_os_error(libc::EBUSY))
            }
        }
        other => Ok(other?),
    }
}

/// The mount point as an absolute path, if it is an empty directory. A
/// FUSE mount left there by a server that died (its users get ENOTCONN) is
/// detached first, so starting again is all a crash asks of the user.
fn usable_mountpoint(path: &Path) -> io::Result<PathBuf> {
    let shown = path.display();
    if let Err(e) = std::fs::metadata(path) {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            tracing::warn!("{shown}: the FUSE server of the mount there is gone; detaching it");
            detach(path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "mount point {shown}: a dead mount is there and cannot be detached: {e}"
                    ),
                )
            })?;
        }
    }
    let dir = path
        .canonicalize()
        .map_err(|e| io::Error::new(e.kind(), format!("mount point {shown}: {e}")))?;
    let mut entries = std::fs::read_dir(&dir)
        .map_err(|e| io::Error::new(e.kind(), format!("mount point {shown}: {e}")))?;
    if entries.next().is_some() {
        return Err(io::Error::new(
            io::ErrorKind::DirectoryNotEmpty,
            format!("mount point {shown} is not empty; mounting over files would hide them"),
        ));
    }
    Ok(dir)
}

/// Whether this process can mount FUSE: `/dev/fuse` exists, and a user who
/// is not root has `fusermount3` and may open the device (fusermount3
/// opens it as that user, so where it is mode 0600 only root can mount).
fn usable_fuse() -> io::Result<()> {
    if !Path::new("/dev/fuse").exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "/dev/fuse is missing: load the fuse module (modprobe fuse) or, in a container, \
             pass the device in (--device /dev/fuse)",
        ));
    }
    if !rustix::process::geteuid().is_root() && !on_path("fusermount3") {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "fusermount3 is missing, and a user who is not root mounts through it: \
             install it (Debian and Ubuntu: apt install fuse3)",
        ));
    }
    let may_open = rustix::fs::access("/dev/fuse", Access::READ_OK | Access::WRITE_OK).is_ok();
    if !rustix::process::geteuid().is_root() && !may_open {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "/dev/fuse is not open to this user, and a user who is not root needs it \
             readable and writable (mode 0666, as Debian and Ubuntu make it): ask for \
             that, or run layerfs as root",
        ));
    }
    Ok(())
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}
