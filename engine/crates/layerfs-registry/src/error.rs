//! Why a pull or a push failed: a kind a caller can act on, and a message
//! for the user.

use std::io;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The reference, the platform or an option is malformed.
    Invalid,
    /// The registry wants credentials, or refused the ones stored.
    Unauthorized,
    /// The registry failed, refused, or sent what does not verify.
    Registry,
    /// The store's filesystem is full.
    NoSpace,
    /// The store or the host failed.
    Store,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, message)
    }

    /// An error of unpacking a blob: a full store, or what the registry
    /// sent (a cut stream, a digest that does not match, a hostile entry).
    pub(crate) fn unpacking(e: io::Error) -> Error {
        let kind = match e.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => ErrorKind::NoSpace,
            io::ErrorKind::PermissionDenied => ErrorKind::Store,
            _ => ErrorKind::Registry,
        };
        Error::new(kind, e.to_string())
    }

    /// The same error, its message after `what: `.
    pub(crate) fn of(self, what: impl std::fmt::Display) -> Error {
        Error::new(self.kind, format!("{what}: {}", self.message))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
