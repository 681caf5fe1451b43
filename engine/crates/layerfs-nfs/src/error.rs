//! Why an NFS or MOUNT call failed.

use nfs3_types::nfs3::nfsstat3;

/// The filesystem's reason, or one only NFS has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    Fs(layerfs_vfs::Error),
    /// The handle is not one this server made.
    BadHandle,
    /// A READDIR cookie or its verifier no longer applies.
    BadCookie,
    /// The reply would not fit in what the client allows.
    TooSmall,
}

impl From<layerfs_vfs::Error> for Error {
    fn from(e: layerfs_vfs::Error) -> Self {
        Error::Fs(e)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Fs(e) => e.fmt(f),
            other => std::fmt::Debug::fmt(other, f),
        }
    }
}

impl std::error::Error for Error {}

/// The status an NFSv3 reply carries for `e`.
pub fn status(e: impl Into<Error>) -> nfsstat3 {
    use layerfs_vfs::Error as Fs;
    match e.into() {
        Error::BadHandle => nfsstat3::NFS3ERR_BADHANDLE,
        Error::BadCookie => nfsstat3::NFS3ERR_BAD_COOKIE,
        Error::TooSmall => nfsstat3::NFS3ERR_TOOSMALL,
        Error::Fs(e) => match e {
            Fs::Perm => nfsstat3::NFS3ERR_PERM,
            Fs::NoEnt => nfsstat3::NFS3ERR_NOENT,
            Fs::Io => nfsstat3::NFS3ERR_IO,
            Fs::Access => nfsstat3::NFS3ERR_ACCES,
            Fs::Exist => nfsstat3::NFS3ERR_EXIST,
            Fs::XDev => nfsstat3::NFS3ERR_XDEV,
            Fs::NotDir => nfsstat3::NFS3ERR_NOTDIR,
            Fs::IsDir => nfsstat3::NFS3ERR_ISDIR,
            Fs::Inval => nfsstat3::NFS3ERR_INVAL,
            Fs::FBig => nfsstat3::NFS3ERR_FBIG,
            Fs::NoSpc => nfsstat3::NFS3ERR_NOSPC,
            Fs::RoFs => nfsstat3::NFS3ERR_ROFS,
            Fs::MLink => nfsstat3::NFS3ERR_MLINK,
            Fs::NameTooLong => nfsstat3::NFS3ERR_NAMETOOLONG,
            Fs::NotEmpty => nfsstat3::NFS3ERR_NOTEMPTY,
            Fs::DQuot => nfsstat3::NFS3ERR_DQUOT,
            Fs::Stale => nfsstat3::NFS3ERR_STALE,
            Fs::NotSync => nfsstat3::NFS3ERR_NOT_SYNC,
            Fs::NotSupp => nfsstat3::NFS3ERR_NOTSUPP,
            // NFSv3 has no extended attributes: never asked for.
            Fs::NoData | Fs::Range => nfsstat3::NFS3ERR_IO,
        },
    }
}
