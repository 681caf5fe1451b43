//! Mounting a workspace through the kernel's NFS client, and unmounting it.
//! Each platform's way is here and nowhere else.

use std::ffi::OsString;
use std::io;
use std::path::Path;

/// The mount point a workspace may be mounted on: an existing, empty
/// directory. A dead FUSE mount left there by a daemon that crashed is
/// detached first.
pub fn check_mountpoint(path: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    if std::fs::read_dir(path).is_err_and(|e| e.raw_os_error() == Some(enotconn())) {
        tracing::warn!(
            "{}: a dead FUSE mount is there: detaching it",
            path.display()
        );
        let _ = rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH);
    }
    let mut entries = std::fs::read_dir(path).map_err(|e| {
        let why = match e.kind() {
            io::ErrorKind::NotFound => "does not exist: make it with mkdir".to_string(),
            _ => e.to_string(),
        };
        io::Error::new(e.kind(), format!("{}: {why}", path.display()))
    })?;
    if entries.next().is_some() {
        return Err(io::Error::new(
            io::ErrorKind::DirectoryNotEmpty,
            format!("{}: not empty: mount on an empty directory", path.display()),
        ));
    }
    Ok(())
}

/// Mounts export `export` (a MNT path such as `/name`) of the NFS server on
/// 127.0.0.1:`port` at `mountpoint`.
pub fn mount_nfs(port: u16, export: &str, mountpoint: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    return linux::mount(port, export, mountpoint);
    #[cfg(target_os = "macos")]
    return macos::run(Path::new(macos::MOUNT_NFS), port, export, mountpoint);
}

/// Unmounts the NFS mount at `mountpoint`, lazily when it is busy.
pub fn unmount_nfs(mountpoint: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    return linux::unmount(mountpoint);
    #[cfg(target_os = "macos")]
    return macos::unmount(mountpoint);
}

/// Makes the NFS client that mounted a workspace at `mountpoint` look again
/// at each of `dirs` (names from the workspace's root), whose entries a
/// reset changed behind it. The client trusts a directory's cached entries
/// and attributes until its attribute cache expires (30 s and more), and
/// macOS' client does not even revalidate at each open. A change the client
/// makes itself it takes in at once: so each directory is given its own
/// mode again through the mount, a SETATTR that changes nothing but makes
/// the client drop what it cached of the directory (EdenFS does the same
/// for macOS checkouts). Best effort: a directory that cannot be changed
/// this way (gone, or not the daemon's user's to chmod) keeps the cache's
/// usual expiry.
pub fn refresh_client_dirs(mountpoint: &Path, dirs: &[Vec<Vec<u8>>]) {
    use std::os::unix::ffi::OsStrExt;
    for names in dirs {
        let mut path = mountpoint.to_path_buf();
        path.extend(names.iter().map(|n| std::ffi::OsStr::from_bytes(n)));
        let refreshed = std::fs::symlink_metadata(&path)
            .and_then(|meta| std::fs::set_permissions(&path, meta.permissions()));
        if let Err(e) = refreshed {
            tracing::debug!(
                "{}: its client's cache is left to expire: {e}",
                path.display()
            );
        }
    }
}

/// Whether something is mounted at `path` (its device differs from its
/// parent's, or it is the root). A dead FUSE mount counts.
pub fn is_mountpoint(path: &Path) -> bool {
    let parent = path.parent().unwrap_or(path);
    match (std::fs::symlink_metadata(path), std::fs::metadata(parent)) {
        (Ok(m), Ok(p)) => {
            use std::os::unix::fs::MetadataExt;
            m.dev() != p.dev() || m.ino() == p.ino()
        }
        (Err(e), _) => e.raw_os_error() == Some(enotconn()),
        _ => false,
    }
}

/// ENOTCONN: what a FUSE mount whose server died answers.
fn enotconn() -> i32 {
    rustix::io::Errno::NOTCONN.raw_os_error()
}

#[cfg(target_os = "linux")]
mod linux {
    use super::*;
    use rustix::mount::{MountFlags, UnmountFlags};

    /// The kernel's own NFS client, through mount(2) with text options
    /// (`layerfs_nfs::mount_options`), so neither mount.nfs nor rpcbind is
    /// needed.
    pub fn mount(port: u16, export: &str, mountpoint: &Path) -> io::Result<()> {
        let options = layerfs_nfs::mount_options::linux([127, 0, 0, 1].into(), port);
        let options = std::ffi::CString::new(options).expect("no NUL in the options");
        rustix::mount::mount(
            format!("127.0.0.1:{export}"),
            mountpoint,
            "nfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(options.as_c_str()),
        )
        .map_err(|e| {
            let hint = match e {
                rustix::io::Errno::PERM => ": mounting over NFS needs root (use --fuse)",
                rustix::io::Errno::NODEV => ": this kernel has no NFS client (use --fuse)",
                _ => "",
            };
            io::Error::new(
                io::Error::from(e).kind(),
                format!("cannot mount NFS on {}: {e}{hint}", mountpoint.display()),
            )
        })
    }

    pub fn unmount(mountpoint: &Path) -> io::Result<()> {
        match rustix::mount::unmount(mountpoint, UnmountFlags::empty()) {
            Err(rustix::io::Errno::BUSY) => {
                tracing::warn!("{} is busy: detached", mountpoint.display());
                Ok(rustix::mount::unmount(mountpoint, UnmountFlags::DETACH)?)
            }
            other => Ok(other?),
        }
    }
}

/// macOS: `mount_nfs` (which needs no root for a mount point the user owns)
/// and `umount`, then `diskutil unmount force` for a busy mount.
/// docs/mounting.md gives the reason for each option.
pub mod macos {
    use super::*;
    use std::process::Command;

    pub const MOUNT_NFS: &str = "/sbin/mount_nfs";

    /// The arguments of `mount_nfs` for export `export` on `port`.
    pub fn mount_nfs_args(port: u16, export: &str, mountpoint: &Path) -> Vec<OsString> {
        let options = layerfs_nfs::mount_options::macos(port);
        vec![
            "-o".into(),
            options.into(),
            format!("127.0.0.1:{export}").into(),
            mountpoint.as_os_str().to_owned(),
        ]
    }

    /// Runs `program` (`mount_nfs`, or a stand-in in tests) with
    /// [`mount_nfs_args`]; its error output becomes the error.
    pub fn run(program: &Path, port: u16, export: &str, mountpoint: &Path) -> io::Result<()> {
        let out = Command::new(program)
            .args(mount_nfs_args(port, export, mountpoint))
            .output()
            .map_err(|e| {
                io::Error::new(e.kind(), format!("cannot run {}: {e}", program.display()))
            })?;
        if out.status.success() {
            return Ok(());
        }
        Err(io::Error::other(format!(
            "{} failed ({}): {}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }

    #[cfg_attr(not(target_os = "macos"), allow(dead_code))]
    pub fn unmount(mountpoint: &Path) -> io::Result<()> {
        let status = Command::new("/sbin/umount").arg(mountpoint).status()?;
        if status.success() {
            return Ok(());
        }
        tracing::warn!("{} is busy: forcing it off", mountpoint.display());
        let status = Command::new("/usr/sbin/diskutil")
            .args(["unmount", "force"])
            .arg(mountpoint)
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "cannot unmount {}",
                mountpoint.display()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn mount_nfs_gets_the_options_written_down() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("args");
        let fake = dir.path().join("mount_nfs");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > {}\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        macos::run(&fake, 20490, "/work", Path::new("/Users/me/work")).unwrap();
        let args = std::fs::read_to_string(&log).unwrap();
        let args: Vec<&str> = args.lines().collect();
        assert_eq!(args[0], "-o");
        for option in [
            "vers=3",
            "tcp",
            "port=20490",
            "mountport=20490",
            "locallocks",
            "rsize=1048576",
            "wsize=1048576",
        ] {
            assert!(
                args[1].split(',').any(|o| o == option),
                "{option} in {}",
                args[1]
            );
        }
        assert!(!args[1].contains("nolocks"), "nolocks makes flock fail");
        assert_eq!(&args[2..], ["127.0.0.1:/work", "/Users/me/work"]);
    }

    #[test]
    fn a_failing_mount_nfs_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("mount_nfs");
        std::fs::write(&fake, "#!/bin/sh\necho 'Permission denied' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = macos::run(&fake, 1, "/w", Path::new("/m")).unwrap_err();
        assert!(e.to_string().contains("Permission denied"), "{e}");
    }

    #[test]
    fn a_mountpoint_must_exist_and_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_mountpoint(&dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let e = check_mountpoint(dir.path()).unwrap_err();
        assert!(e.to_string().contains("not empty"), "{e}");
    }
}
