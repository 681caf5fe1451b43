//! Building blocks for filesystems kept in host directories: how to read
//! attributes, which names and changes are allowed, and the operations on one
//! directory entry as a local kernel would do them. [`crate::LocalFs`] and the
//! layered workspace share them.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::access::{self, Caller, Perm};
use crate::attr::{Attr, FileKind, SetAttr, SetTime};
use crate::error::{Error, Result};
use crate::fs::{Allocate, Create, FsStat, NewEntry, ReadSource, Stability};

mod lending;
mod listing;
mod rules;
mod stat;
mod sys;
pub mod watch;

pub use lending::lending_write;
pub use listing::{list, name_cookie};
pub use rules::{
    apply, check_name, check_setattr, creatable, cstr, exclusive_times, may_change_entries,
    may_rename, mode_after_write, mode_of_new, mode_without_privilege, removable, sticky_allows,
    timestamps,
};
#[cfg(feature = "count-host-calls")]
pub use stat::reads_during as stat_reads_during;
pub use stat::{host_attr, keeps_inode_numbers, Stats};
pub use sys::{rename_anew, sync_all, sync_data};

/// How entries are made and changed in one host filesystem.
#[derive(Clone, Copy, Debug)]
pub struct Host {
    pub stats: Stats,
    /// The server may give files to their creators and make device files.
    pub as_root: bool,
}

impl Host {
    pub fn for_dir(root: BorrowedFd<'_>) -> Host {
        Host {
            stats: Stats::for_export(root),
            as_root: rustix::process::geteuid().is_root(),
        }
    }

    /// Makes `name` in `dir` (whose attributes are `dir_attr`) and applies `set`.
    pub fn make(
        &self,
        caller: &Caller,
        dir: BorrowedFd<'_>,
        dir_attr: &Attr,
        name: &CStr,
        what: NewEntry<'_>,
        set: &SetAttr,
    ) -> Result<Attr> {
        let mode = |default| permissions(set.mode.unwrap_or(default));
        match what {
            NewEntry::Dir => rustix::fs::mkdirat(dir, name, mode(0o755))?,
            NewEntry::Symlink(target) => {
                if target.is_empty() {
                    return Err(Error::Inval);
                }
                rustix::fs::symlinkat(&*cstr(target)?, dir, name)?
            }
            NewEntry::Node(kind, rdev) => {
                let file_type = match kind {
                    FileKind::Fifo => FileType::Fifo,
                    FileKind::Socket => FileType::Socket,
                    FileKind::CharDevice if self.as_root => FileType::CharacterDevice,
                    FileKind::BlockDevice if self.as_root => FileType::BlockDevice,
                    FileKind::CharDevice | FileKind::BlockDevice => return Err(Error::NotSupp),
                    _ => return Err(Error::Inval),
                };
                sys::mknod(dir, name, file_type, mode(0o644), rdev)?
            }
        }
        self.finish_new(caller, dir, dir_attr, name, set)
    }

    /// Creates the regular file `name` in `dir` as CREATE does (RFC 1813
    /// §3.3.8) and returns its attributes, with the file open for reading
    /// and writing when this call made it: its writes usually follow.
    pub fn create(
        &self,
        caller: &Caller,
        dir: BorrowedFd<'_>,
        dir_attr: &Attr,
        name: &CStr,
        how: Create,
    ) -> Result<(Attr, Option<OwnedFd>)> {
        let base =
            OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
        let set = match how {
            Create::Unchecked(set) | Create::Guarded(set) => set,
            Create::Exclusive(_) => SetAttr::default(),
        };
        let mode = permissions(set.mode.unwrap_or(0o644));
        let created = match rustix::fs::openat(dir, name, base | OFlags::EXCL, mode) {
            Ok(file) => Some(file),
            Err(Errno::EXIST) if matches!(how, Create::Guarded(_)) => return Err(Error::Exist),
            Err(Errno::EXIST) => None,
            Err(Errno::ISDIR) => return Err(Error::Exist),
            Err(e) => return Err(e.into()),
        };
        if let Some(file) = created {
            let set = match how {
                Create::Exclusive(verf) => {
                    let (atime, mtime) = exclusive_times(verf);
                    SetAttr {
                        atime: SetTime::Client(atime),
                        mtime: SetTime::Client(mtime),
                        ..SetAttr::default()
                    }
                }
                _ => SetAttr {
                    mode: Some(set.mode.unwrap_or(0o644)),
                    ..set
                },
            };
            let attr = self.finish_new_file(caller, file.as_fd(), dir_attr, &set)?;
            return Ok((attr, Some(file)));
        }
        let existing = match how {
            Create::Exclusive(verf) => {
                let existing = self.stats.at(dir, name)?;
                if existing.kind != FileKind::Regular
                    || exclusive_times(verf) != (existing.atime, existing.mtime)
                {
                    return Err(Error::Exist);
                }
                existing
            }
            _ => {
                // UNCHECKED on an existing file: only the size applies.
                let existing = self.stats.at(dir, name)?;
                if existing.kind == FileKind::Directory {
                    return Err(Error::IsDir);
                }
                if let Some(size) = set.size {
                    if !access::owner_may(&existing, caller, Perm::WRITE) {
                        return Err(Error::Access);
                    }
                    truncate_at(dir, name, size)?;
                }
                self.stats.at(dir, name)?
            }
        };
        Ok((existing, None))
    }

    /// Gives a new entry to its creator (the directory's group if it is
    /// setgid), sets the mode asked for (the server's umask does not apply to
    /// clients' files) and applies the rest of `set`.
    fn finish_new(
        &self,
        caller: &Caller,
        dir: BorrowedFd<'_>,
        dir_attr: &Attr,
        name: &CStr,
        set: &SetAttr,
    ) -> Result<Attr> {
        if self.as_root {
            let (uid, gid) = owner_of_new(caller, dir_attr, set);
            rustix::fs::chownat(dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)?;
        }
        let attr = self.stats.at(dir, name)?;
        let mode = set
            .mode
            .map(|asked| mode_of_new(caller, asked, &attr))
            .filter(|&mode| mode != attr.mode && attr.kind != FileKind::Symlink);
        let rest = SetAttr {
            uid: None,
            gid: None,
            mode,
            ..*set
        };
        if rest.is_empty() {
            return Ok(attr);
        }
        self.change(dir, name, &attr, &rest)
    }

    /// [`finish_new`](Self::finish_new) for a regular file just made and
    /// still open: every change goes through `file`, which names the file
    /// made whatever its name names by now, and only changes the file needs
    /// are made (most files need none, or only their owner).
    fn finish_new_file(
        &self,
        caller: &Caller,
        file: BorrowedFd<'_>,
        dir_attr: &Attr,
        set: &SetAttr,
    ) -> Result<Attr> {
        let made = self.stats.fd(file)?;
        let mut changed = false;
        let mut owned = made;
        if self.as_root {
            let (uid, gid) = owner_of_new(caller, dir_attr, set);
            (owned.uid, owned.gid) = (uid.as_raw(), gid.as_raw());
            if (owned.uid, owned.gid) != (made.uid, made.gid) {
                rustix::fs::fchown(file, Some(uid), Some(gid))?;
                changed = true;
            }
        }
        if let Some(asked) = set.mode {
            let mode = mode_of_new(caller, asked, &owned);
            // A chown by root clears the setuid and setgid bits.
            if mode != made.mode || (changed && mode & 0o6000 != 0) {
                rustix::fs::fchmod(file, permissions(mode))?;
                changed = true;
            }
        }
        if let Some(size) = set.size.filter(|&size| size != made.size) {
            rustix::fs::ftruncate(file, size)?;
            changed = true;
        }
        if let Some(times) = timestamps(set) {
            rustix::fs::futimens(file, &times)?;
            changed = true;
        }
        if changed {
            self.stats.fd(file)
        } else {
            Ok(made)
        }
    }

    /// Applies `set` to `name` in `dir`, whose attributes are `before`, once
    /// `check_setattr` allowed it.
    pub fn change(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        before: &Attr,
        set: &SetAttr,
    ) -> Result<Attr> {
        if let Some(size) = set.size {
            match before.kind {
                FileKind::Regular => truncate_at(dir, name, size)?,
                FileKind::Directory => return Err(Error::IsDir),
                _ => return Err(Error::Inval),
            }
        }
        if let Some(mode) = set.mode {
            if before.kind != FileKind::Symlink {
                chmod_at(dir, name, permissions(mode))?;
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            rustix::fs::chownat(
                dir,
                name,
                set.uid.map(rustix::fs::Uid::from_raw),
                set.gid.map(rustix::fs::Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        apply(dir, name, set)?;
        self.stats.at(dir, name)
    }
}

/// Who owns a new entry made for `caller` in a directory with attributes
/// `dir`: the owner `set` asks for, else the caller, in the directory's
/// group if it is setgid.
fn owner_of_new(caller: &Caller, dir: &Attr, set: &SetAttr) -> (rustix::fs::Uid, rustix::fs::Gid) {
    let gid = if dir.mode & 0o2000 != 0 {
        dir.gid
    } else {
        caller.gid
    };
    (
        rustix::fs::Uid::from_raw(set.uid.unwrap_or(caller.uid)),
        rustix::fs::Gid::from_raw(set.gid.unwrap_or(gid)),
    )
}

/// Truncates the regular file `name`.
fn truncate_at(dir: BorrowedFd<'_>, name: &CStr, size: u64) -> Result<()> {
    let file = open_regular(dir, name, OFlags::WRONLY)?;
    Ok(rustix::fs::ftruncate(&file, size)?)
}

/// The permission bits of `mode` (an NFS or FUSE mode, 32 bits) as the
/// host takes them (`mode_t` is 16 bits on macOS).
pub fn permissions(mode: u32) -> Mode {
    Mode::from_raw_mode((mode & 0o7777) as rustix::fs::RawMode)
}

/// Makes everything written to the filesystem holding `fd` durable: that
/// filesystem alone on Linux, every one elsewhere (no `syncfs`).
pub fn sync_filesystem(fd: BorrowedFd<'_>) -> Result<()> {
    #[cfg(target_os = "linux")]
    rustix::fs::syncfs(fd)?;
    #[cfg(not(target_os = "linux"))]
    {
        let _ = fd;
        rustix::fs::sync();
    }
    Ok(())
}

/// Sets the permission bits of `name` in `dir`, never through a symlink:
/// the entry checked before may have been swapped for a symlink to a file
/// outside the export since. A symlink found here is left as it is (a
/// symlink's own mode means nothing on Linux).
pub fn chmod_at(dir: BorrowedFd<'_>, name: &CStr, mode: Mode) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        match sys::fchmodat2_nofollow(dir, name, mode) {
            // The entry is a symlink by now.
            Some(Err(Errno::OPNOTSUPP)) => Ok(()),
            Some(done) => Ok(done?),
            None => chmod_through_proc(dir, name, mode),
        }
    }
    #[cfg(not(target_os = "linux"))]
    Ok(rustix::fs::chmodat(
        dir,
        name,
        mode,
        AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// [`chmod_at`] on a kernel without `fchmodat2`, whose chmodat cannot
/// refuse a symlink, and whose fchmod refuses an O_PATH descriptor: the
/// descriptor's own entry in /proc/self/fd names exactly the inode opened,
/// whatever the name points to by now.
#[cfg(target_os = "linux")]
fn chmod_through_proc(dir: BorrowedFd<'_>, name: &CStr, mode: Mode) -> Result<()> {
    use std::os::fd::AsRawFd;
    let entry = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&entry)?.st_mode).is_symlink() {
        return Ok(());
    }
    let path = format!("/proc/self/fd/{}", entry.as_raw_fd());
    Ok(rustix::fs::chmod(path.as_str(), mode)?)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Both ways of `chmod_at` change a file and leave a symlink's target alone.
    #[test]
    fn a_chmod_changes_the_entry_and_never_a_symlinks_target() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("target"), b"").unwrap();
        std::os::unix::fs::symlink(t.path().join("target"), t.path().join("link")).unwrap();
        std::fs::write(t.path().join("file"), b"").unwrap();
        let dir = rustix::fs::open(t.path(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        let mode_of = |name: &str| {
            std::fs::metadata(t.path().join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        let before = mode_of("target");
        type Chmod = fn(BorrowedFd<'_>, &CStr, Mode) -> Result<()>;
        let ways: [(Chmod, u32); 2] = [(chmod_at, 0o604), (chmod_through_proc, 0o640)];
        for (way, mode) in ways {
            way(dir.as_fd(), c"link", permissions(mode)).unwrap();
            assert_eq!(mode_of("target"), before, "through the symlink");
            way(dir.as_fd(), c"file", permissions(mode)).unwrap();
            assert_eq!(mode_of("file"), mode);
        }
    }

    /// A FIFO put where a file was looked at is refused at once. Opened for
    /// reading (a FIFO the server may not write), it would wait for a
    /// writer that never comes; opened for both, it would be served as a
    /// file.
    #[test]
    fn a_fifo_in_place_of_a_file_is_refused_without_waiting_for_a_writer() {
        let t = tempfile::tempdir().unwrap();
        let dir = rustix::fs::open(t.path(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        for (name, mode) in [(c"read-only", 0o444), (c"writable", 0o666)] {
            rustix::fs::mknodat(&dir, name, FileType::Fifo, permissions(mode), 0).unwrap();
        }
        std::fs::write(t.path().join("file"), b"data").unwrap();
        let (done, opened) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for name in [c"read-only", c"writable", c"file"] {
                let _ = done.send(open_file(dir.as_fd(), name).map(|_| ()));
            }
        });
        for (name, want) in [
            ("read-only", Err(Error::Inval)),
            ("writable", Err(Error::Inval)),
            ("file", Ok(())),
        ] {
            let got = opened
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("opening {name} still waits after 10 s"));
            assert_eq!(got, want, "{name}");
        }
    }
}

/// Where a READ of `count` bytes at `offset` of the open `file` (whose
/// attributes are `attr`) finds its bytes, for sending without a copy.
pub fn read_source(file: Arc<OwnedFd>, attr: Attr, offset: u64, count: usize) -> ReadSource {
    let len = count.min(attr.size.saturating_sub(offset) as usize);
    let eof = offset.saturating_add(len as u64) >= attr.size;
    ReadSource {
        file,
        offset,
        len,
        eof,
        attr,
    }
}

/// Appends up to `count` bytes of `fd` (whose attributes are `attr`) at
/// `offset` to `dst`, reading into its spare capacity (no zeroing pass
/// first); returns whether the end was reached, and `attr`.
pub fn read(
    fd: BorrowedFd<'_>,
    attr: Attr,
    offset: u64,
    count: usize,
    dst: &mut Vec<u8>,
) -> Result<(bool, Attr)> {
    let want = count.min(attr.size.saturating_sub(offset) as usize);
    let start = dst.len();
    let mut n = 0;
    while n < want {
        dst.reserve(want - n);
        match rustix::io::pread(fd, rustix::buffer::spare_capacity(dst), offset + n as u64) {
            Ok(0) => break,
            Ok(got) => n += got,
            Err(Errno::INTR) => continue,
            Err(e) => {
                dst.truncate(start);
                return Err(e.into());
            }
        }
    }
    // A read may fill more than `want`; the excess is cut.
    let n = n.min(want);
    dst.truncate(start + n);
    Ok((offset.saturating_add(n as u64) >= attr.size, attr))
}

/// Writes all of `data` at `offset`, then makes it as durable as `stable` asks.
pub fn write_at(fd: BorrowedFd<'_>, offset: u64, data: &[u8], stable: Stability) -> Result<()> {
    offset
        .checked_add(data.len() as u64)
        .filter(|&end| end <= i64::MAX as u64)
        .ok_or(Error::FBig)?;
    let mut n = 0;
    while n < data.len() {
        match rustix::io::pwrite(fd, &data[n..], offset + n as u64) {
            Ok(0) => return Err(Error::NoSpc),
            Ok(put) => n += put,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    match stable {
        Stability::Unstable => Ok(()),
        Stability::DataSync => sync_data(fd),
        Stability::FileSync => sync_all(fd),
    }
}

/// Space and file counts of the filesystem holding `fd`.
pub fn fsstat(fd: BorrowedFd<'_>) -> Result<FsStat> {
    let s = rustix::fs::fstatvfs(fd)?;
    let unit = s.f_frsize.max(1);
    Ok(FsStat {
        total_bytes: s.f_blocks * unit,
        free_bytes: s.f_bfree * unit,
        avail_bytes: s.f_bavail * unit,
        total_files: s.f_files,
        free_files: s.f_ffree,
        avail_files: s.f_favail,
    })
}

/// Opens the regular file `name` in `dir` for reading and writing, or for
/// reading only where writing is refused.
pub fn open_file(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd> {
    match open_regular(dir, name, OFlags::RDWR) {
        Err(Error::Access | Error::RoFs | Error::Perm) => open_regular(dir, name, OFlags::RDONLY),
        other => other,
    }
}

/// Opens `name` in `dir` with `access` if it is a regular file, and is
/// `Inval` otherwise. The name was a regular file when it was looked at,
/// but anyone who may write `dir` can put something else there in between:
/// never a symlink followed, a terminal made ours, nor a wait on a FIFO
/// (opened for reading only, it waits for a writer, and a worker with it).
pub fn open_regular(dir: BorrowedFd<'_>, name: &CStr, access: OFlags) -> Result<OwnedFd> {
    let flags = OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let file = rustix::fs::openat(dir, name, flags | access, Mode::empty())?;
    if !FileType::from_raw_mode(rustix::fs::fstat(&file)?.st_mode).is_file() {
        return Err(Error::Inval);
    }
    Ok(file)
}

/// Does `how` to `len` bytes at `offset` of the open file `fd`.
#[cfg(target_os = "linux")]
pub fn allocate(fd: BorrowedFd<'_>, offset: u64, len: u64, how: Allocate) -> Result<()> {
    use rustix::fs::FallocateFlags as F;
    let mode = match how {
        Allocate::Extend => F::empty(),
        Allocate::KeepSize => F::KEEP_SIZE,
        Allocate::PunchHole => F::PUNCH_HOLE | F::KEEP_SIZE,
    };
    Ok(rustix::fs::fallocate(fd, mode, offset, len)?)
}

/// Does `how` to `len` bytes at `offset` of the open file `fd`: not offered
/// here, as no door asks for it.
#[cfg(not(target_os = "linux"))]
pub fn allocate(_fd: BorrowedFd<'_>, _offset: u64, _len: u64, _how: Allocate) -> Result<()> {
    Err(Error::NotSupp)
}

/// Opens the directory `name` in `dir` without following a symlink.
pub fn open_dir(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<rustix::fd::OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Raises the soft limit on open files to the hard one, for servers that
/// keep descriptors cached; returns the limit now in force.
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if setrlimit(Resource::Nofile, limit).is_err() {
            limit = getrlimit(Resource::Nofile);
        }
    }
    limit.current.unwrap_or(1 << 20).min(1 << 20)
}
