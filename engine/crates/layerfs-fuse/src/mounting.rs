//! Mounting a FUSE connection and taking it down: mount(2) as root,
//! `fusermount3` (setuid root) as a user, whose device comes back over a
//! socket; unmounting the same two ways.

use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::{Access, Mode, OFlags};
use rustix::mount::MountFlags;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

/// How a connection is mounted.
#[derive(Clone, Debug)]
pub(crate) struct MountAs {
    /// The name the mount table shows as the source.
    pub source: String,
    /// Every user may reach the mount (`allow_other`), not only its owner.
    pub allow_other: bool,
}

impl MountAs {
    /// The options both ways take. The kernel checks permission on every
    /// path walk, open and change against the attributes it holds
    /// (`default_permissions`), before it asks the door: without it, a
    /// name the kernel has cached is reached with no search permission
    /// checked, and FIFOs and O_TRUNC are not checked at all. The door
    /// checks again.
    fn options(&self) -> Vec<&'static str> {
        let mut options = vec!["default_permissions"];
        if self.allow_other {
            options.push("allow_other");
        }
        options
    }
}

/// A new FUSE connection mounted at `mountpoint` (an empty directory):
/// its device, on which the kernel's INIT comes first. nosuid and nodev.
pub(crate) fn mount(mountpoint: &Path, how: &MountAs) -> io::Result<OwnedFd> {
    let said = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("cannot mount on {}: {e}", mountpoint.display()),
        )
    };
    if rustix::process::geteuid().is_root() {
        match mount_directly(mountpoint, how) {
            // Root without the capability (a user namespace): as a user.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            other => return other.map_err(said),
        }
    }
    through_fusermount(mountpoint, how).map_err(said)
}

/// mount(2) of a device of its own, as root.
fn mount_directly(mountpoint: &Path, how: &MountAs) -> io::Result<OwnedFd> {
    let device = rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let mode = rustix::fs::stat(mountpoint)?.st_mode;
    let mut data = format!(
        "fd={},rootmode={mode:o},user_id={},group_id={}",
        device.as_raw_fd(),
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    for option in how.options() {
        data.push(',');
        data.push_str(option);
    }
    rustix::mount::mount(
        how.source.as_str(),
        mountpoint,
        "fuse.layerfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        std::ffi::CString::new(data)
            .map_err(|_| io::Error::other("a mount option holds a NUL"))?
            .as_c_str(),
    )?;
    Ok(device)
}

/// `fusermount3 -o OPTIONS -- MOUNTPOINT`, which opens the device, mounts
/// it and sends it back over the socket `_FUSE_COMMFD` names.
fn through_fusermount(mountpoint: &Path, how: &MountAs) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    // The child's end is inherited: without close-on-exec, which the
    // standard library sets; ours keeps it.
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty())?;
    let mut options = vec![
        format!("fsname={}", how.source),
        "subtype=layerfs".to_string(),
        "nosuid".to_string(),
        "nodev".to_string(),
    ];
    options.extend(how.options().into_iter().map(String::from));
    let mut child = Command::new("fusermount3")
        .arg("-o")
        .arg(options.join(","))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    drop(theirs);
    let received = receive_device(&ours);
    drop(ours);
    let mut said = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut said);
    }
    let status = child.wait()?;
    match received {
        Ok(device) if status.success() => Ok(device),
        _ => Err(io::Error::other(format!(
            "fusermount3 {status}: {}",
            said.trim()
        ))),
    }
}

/// The descriptor fusermount3 sends (SCM_RIGHTS, with one byte).
fn receive_device(socket: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    loop {
        match rustix::net::recvmsg(
            socket.as_fd(),
            &mut [IoSliceMut::new(&mut byte)],
            &mut ancillary,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message {
            if let Some(device) = fds.next() {
                return Ok(device);
            }
        }
    }
    Err(io::Error::other("fusermount3 sent no FUSE device"))
}

/// Unmounts: directly where allowed, else through `fusermount3`.
pub(crate) fn unmount(path: &Path) -> io::Result<()> {
    unmount_with(path, rustix::mount::UnmountFlags::empty())
}

/// Detaches a busy mount: directly where allowed, else through `fusermount3`.
pub(crate) fn detach(path: &Path) -> io::Result<()> {
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
pub(crate) fn usable_mountpoint(path: &Path) -> io::Result<PathBuf> {
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
pub(crate) fn usable_fuse() -> io::Result<()> {
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

/// Lets the kernel read ahead as much as one READ may carry.
///
/// A FUSE mount starts with the kernel's default readahead, 128 KiB, which
/// cuts a sequential read of a file the door serves (a lower file) into
/// READs of that size, each a round trip: measured, a cold 512 MiB read
/// took 0.46 s at 128 KiB and 0.23 s at 1 MiB (tmpfs layer, 0.085 s read
/// directly). The window is a setting of the mount's own backing device,
/// which only root may change; elsewhere the default stays.
pub(crate) fn widen_readahead(mountpoint: &Path) {
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
