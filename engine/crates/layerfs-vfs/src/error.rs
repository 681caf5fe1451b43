use std::fmt;
use std::io;

/// Why an operation failed, in the terms NFS and FUSE both answer with.
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
    /// The file the handle named is gone.
    Stale,
    /// The handle is not one this server made.
    BadHandle,
    /// A guarded SETATTR whose guard no longer matches the file's ctime.
    NotSync,
    /// A READDIR cookie or its verifier no longer applies.
    BadCookie,
    NotSupp,
    /// The reply would not fit in what the client allows.
    TooSmall,
    ServerFault,
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
            _ => Error::Io,
        }
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

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for Error {}
