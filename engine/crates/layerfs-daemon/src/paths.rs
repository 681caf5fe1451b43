//! Where a store and its control socket live.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The store used when none is given: the user's data directory
/// (`$XDG_DATA_HOME/layerfs`, `~/.local/share/layerfs`, or
/// `~/Library/Application Support/layerfs` on macOS).
pub fn default_store() -> io::Result<PathBuf> {
    dirs::data_dir().map(|d| d.join("layerfs")).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "no data directory (HOME unset?): give --store DIR",
        )
    })
}

/// The control socket of the daemon serving `store` (an absolute path): in
/// a directory only this user can open (`$XDG_RUNTIME_DIR/layerfs/`; without
/// that variable, as a system service has none, `/run/layerfs/` for root
/// and `$TMPDIR/layerfs-UID/` for others), named by a hash of the store's
/// path, since a socket's path must stay short.
pub fn control_socket(store: &Path) -> io::Result<PathBuf> {
    let dir = match dirs::runtime_dir() {
        Some(runtime) => runtime.join("layerfs"),
        None => without_runtime_dir(),
    };
    private_dir(&dir)?;
    Ok(dir.join(socket_name(store)))
}

/// Where a command reaches the daemon of `store`: its control socket, or,
/// for root where that is not there, the one a system service (which has
/// no `$XDG_RUNTIME_DIR`) made.
pub fn socket_to_reach(store: &Path) -> io::Result<PathBuf> {
    let own = control_socket(store)?;
    if own.exists() || !rustix::process::geteuid().is_root() {
        return Ok(own);
    }
    let system = without_runtime_dir().join(socket_name(store));
    Ok(if system.exists() { system } else { own })
}

/// The socket directory of a user with no `$XDG_RUNTIME_DIR`.
fn without_runtime_dir() -> PathBuf {
    let uid = rustix::process::geteuid();
    if !uid.is_root() {
        std::env::temp_dir().join(format!("layerfs-{}", uid.as_raw()))
    } else if cfg!(target_os = "linux") {
        PathBuf::from("/run/layerfs")
    } else {
        PathBuf::from("/var/run/layerfs")
    }
}

fn socket_name(store: &Path) -> String {
    format!("{:016x}.sock", fnv1a(store.as_os_str().as_encoded_bytes()))
}

/// The socket of the keeper of `store`'s FUSE descriptors (`crate::keeper`),
/// beside its control socket.
pub fn keeper_socket(store: &Path) -> io::Result<PathBuf> {
    Ok(control_socket(store)?.with_extension("keeper"))
}

/// Makes `dir` if missing (mode 0700) and checks that it is a directory of
/// this user that nobody else can open: another user who made it first
/// could otherwise sit between the command and the daemon.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot make {}: {e}", dir.display()),
            ))
        }
        _ => {}
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let uid = rustix::process::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} must be a directory owned by uid {uid} with mode 0700 \
                 (it is owned by {} with mode {:o}): remove it",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// FNV-1a: the same hash in every build, which the daemon and the command
/// must agree on.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_socket_directory_others_can_open_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("layerfs");
        private_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_dir(&dir).unwrap_err();
        assert!(e.to_string().contains("mode 755"), "{e}");
    }

    #[test]
    fn stores_get_their_own_sockets() {
        assert_ne!(fnv1a(b"/a/store"), fnv1a(b"/b/store"));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
