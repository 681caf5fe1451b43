//! A live FUSE session handed from one server process to the next.
//!
//! A FUSE mount lives while some process holds its `/dev/fuse` descriptor:
//! the kernel aborts the connection (its users get ENOTCONN) only when the
//! last copy closes. So a server that gives a copy to a process that
//! outlives it (the daemon's keeper) leaves its mount alive when it dies;
//! requests then wait in the kernel's queue until a new server takes the
//! session over from that copy ([`crate::resume`]).
//!
//! The kernel sends FUSE_INIT once per connection: the next server does not
//! see it, and agrees again, by the same rule, to what the first server
//! did, from what that INIT offered ([`KernelInit`], kept with the
//! descriptor; `Connection::resume` in `connection.rs`).
//!
//! Requests the dead server had read and not answered are on the kernel's
//! processing list, answered by nobody. FUSE_NOTIFY_RESEND (Linux 6.9)
//! queues them again for the new server. Older kernels refuse it: the
//! processes that made those requests wait until they are killed or the
//! mount is taken down (`umount -l`, or an abort under
//! `/sys/fs/fuse/connections`).
//!
//! A request is resent whole even if the dead server had carried part or
//! all of it out: one that is not idempotent (a CREATE with O_EXCL, an
//! UNLINK, a RENAME) can then fail with EEXIST or ENOENT, as an NFS call
//! retransmitted after a server restart can.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, OwnedFd};

use zerocopy::IntoBytes;

use crate::abi::{OutHeader, NOTIFY_RESEND};
pub use crate::connection::KernelInit;

/// A session's device descriptor, what its first INIT said and the table
/// of its open files: all another process needs to take the session over.
#[derive(Debug)]
pub struct Kept {
    pub device: OwnedFd,
    pub kernel: KernelInit,
    /// Each inode's opens (the door's open-file table, a memfd); none from a server that
    /// kept no table, whose successor then answers as a fresh server.
    pub opens: Option<OwnedFd>,
}

/// Asks the kernel to send again every request a server of this connection
/// read and did not answer. False where the kernel does not know the
/// notification (before Linux 6.9).
pub(crate) fn ask_resend(device: impl AsFd) -> io::Result<bool> {
    let notify = OutHeader {
        len: size_of::<OutHeader>() as u32,
        error: NOTIFY_RESEND,
        unique: 0,
    };
    match rustix::io::write(device, notify.as_bytes()) {
        Ok(_) => Ok(true),
        Err(rustix::io::Errno::INVAL) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
