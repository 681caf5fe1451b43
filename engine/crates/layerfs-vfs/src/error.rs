use std::fmt;
use std::io;

/// Why an operation on a [`Filesystem`](crate::Filesystem) failed, in terms
/// both doors answer with: NFS maps each to an `nfsstat3`, FUSE to the errno
/// of [`Error::errno`]. Errors only a door can have (a malformed handle, a
/// reply too small) belong to that door.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    Perm,
    NoEnt,
    Io,
    Access,
    Exist,
    XDev,
    NotDir,
    IsDir,
    Inval,
    FBig,
    NoSpc,
    RoFs,
    MLink,
    NameTooLong,
    NotEmpty,
    DQuot,
    /// The file the id named is gone.
    Stale,
    /// A guarded change whose guard no longer matches the file's ctime.
    NotSync,
    NotSupp,
    /// No such extended attribute.
    NoData,
    /// An extended attribute's value, or the list of their names, is larger
    /// than the caller's buffer.
    Range,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The closest error for an errno from the host filesystem.
    pub fn from_errno(errno: i32) -> Error {
        use rustix::io::Errno;
        let e = Errno::from_raw_os_error(errno);
        match e {
            Errno::PERM => Error::Perm,
            Errno::NOENT => Error::NoEnt,
            Errno::ACCESS => Error::Access,
            Errno::EXIST => Error::Exist,
            Errno::XDEV => Error::XDev,
            Errno::NOTDIR | Errno::LOOP => Error::NotDir,
            Errno::ISDIR => Error::IsDir,
            Errno::INVAL => Error::Inval,
            Errno::FBIG => Error::FBig,
            Errno::NOSPC => Error::NoSpc,
            Errno::ROFS => Error::RoFs,
            Errno::MLINK => Error::MLink,
            Errno::NAMETOOLONG => Error::NameTooLong,
            Errno::NOTEMPTY => Error::NotEmpty,
            Errno::DQUOT => Error::DQuot,
            Errno::STALE => Error::Stale,
            Errno::NOTSUP | Errno::NOSYS => Error::NotSupp,
            Errno::NODATA => Error::NoData,
            Errno::RANGE => Error::Range,
            _ => Error::Io,
        }
    }

    /// The errno a local filesystem would fail with.
    pub fn errno(self) -> i32 {
        use rustix::io::Errno;
        let e = match self {
            Error::Perm => Errno::PERM,
            Error::NoEnt => Errno::NOENT,
            Error::Io => Errno::IO,
            Error::Access => Errno::ACCESS,
            Error::Exist => Errno::EXIST,
            Error::XDev => Errno::XDEV,
            Error::NotDir => Errno::NOTDIR,
            Error::IsDir => Errno::ISDIR,
            Error::Inval => Errno::INVAL,
            Error::FBig => Errno::FBIG,
            Error::NoSpc => Errno::NOSPC,
            Error::RoFs => Errno::ROFS,
            Error::MLink => Errno::MLINK,
            Error::NameTooLong => Errno::NAMETOOLONG,
            Error::NotEmpty => Errno::NOTEMPTY,
            Error::DQuot => Errno::DQUOT,
            Error::Stale => Errno::STALE,
            // A change raced another one; trying again may succeed.
            Error::NotSync => Errno::AGAIN,
            Error::NotSupp => Errno::OPNOTSUPP,
            Error::NoData => Errno::NODATA,
            Error::Range => Errno::RANGE,
        };
        e.raw_os_error()
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Self {
        Error::from_errno(e.raw_os_error())
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(errno) => Error::from_errno(errno),
            None if e.kind() == io::ErrorKind::NotFound => Error::NoEnt,
            None => Error::Io,
        }
    }
}

/// What a user reads: the host's words for the errno ("Permission denied
/// (os error 13)"), but where the errno would mislead.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Stale => f.write_str("the file is gone (stale)"),
            Error::NotSync => f.write_str("the file changed meanwhile"),
            e => io::Error::from_raw_os_error(e.errno()).fmt(f),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_an_errno_that_maps_back() {
        use Error::*;
        let all = [
            Perm,
            NoEnt,
            Io,
            Access,
            Exist,
            XDev,
            NotDir,
            IsDir,
            Inval,
            FBig,
            NoSpc,
            RoFs,
            MLink,
            NameTooLong,
            NotEmpty,
            DQuot,
            Stale,
            NotSupp,
        ];
        for e in all {
            assert_eq!(Error::from_errno(e.errno()), e, "{e:?}");
        }
        assert_eq!(NotSync.errno(), libc_eagain());
    }

    fn libc_eagain() -> i32 {
        rustix::io::Errno::AGAIN.raw_os_error()
    }
}
