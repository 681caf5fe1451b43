//! A live FUSE session handed from one server process to the next.
//!
//! A FUSE mount lives while some process holds its `/dev/fuse` descriptor:
//! the kernel aborts the connection (its users get ENOTCONN) only when the
//! last copy closes. So a server that gives a copy to a process that
//! outlives it (the daemon's keeper) leaves its mount alive when it dies;
//! requests then wait in the kernel's queue until a new server takes the
//! session over from that copy ([`crate::resume`]).
//!
//! Two things stand in the way, and this module does both:
//! - The kernel sends FUSE_INIT once per connection, and fuser starts every
//!   session by reading one. A session taken over is started on a socket
//!   that holds an INIT rebuilt from the one the kernel sent first
//!   ([`KernelInit`], kept with the descriptor), and only then is its
//!   descriptor made the kept device, before any request is read from it.
//! - Requests the dead server had read and not answered are on the kernel's
//!   processing list, answered by nobody. FUSE_NOTIFY_RESEND (Linux 6.9)
//!   queues them again for the new server. Older kernels refuse it: the
//!   processes that made those requests wait until they are killed or the
//!   mount is taken down (`umount -l`, or an abort under
//!   `/sys/fs/fuse/connections`).
//!
//! A request is resent whole even if the dead server had carried part or
//! all of it out: one that is not idempotent (a CREATE with O_EXCL, an
//! UNLINK, a RENAME) can then fail with EEXIST or ENOENT, as an NFS call
//! retransmitted after a server restart can.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;

use zerocopy::IntoBytes;

use crate::abi::{opcode, InHeader, InitIn, OutHeader, INIT_EXT, NOTIFY_RESEND};

/// What the kernel told the first server of a session in its FUSE_INIT:
/// enough to rebuild that INIT for the next server, which then agrees to
/// the same settings (passthrough, writeback cache) it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInit {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// The capabilities offered (`flags` and `flags2` as one word).
    pub flags: u64,
}

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

impl KernelInit {
    /// The FUSE_INIT request the kernel sent, as fuser reads it: a
    /// `fuse_in_header` from this process's own ids, then `fuse_init_in`.
    pub fn request(&self) -> Vec<u8> {
        const LEN: usize = size_of::<InHeader>() + size_of::<InitIn>();
        let flags = match self.flags >> 32 {
            0 => self.flags,
            _ => self.flags | INIT_EXT,
        };
        let header = InHeader {
            len: LEN as u32,
            opcode: opcode::INIT,
            unique: 1,
            nodeid: 0,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            pid: std::process::id(),
            ..Default::default()
        };
        let init = InitIn {
            major: self.major,
            minor: self.minor,
            max_readahead: self.max_readahead,
            flags: flags as u32,
            flags2: (flags >> 32) as u32,
            ..Default::default()
        };
        [header.as_bytes(), init.as_bytes()].concat()
    }
}

/// Starts a fuser session on `device`, a live connection whose INIT was
/// answered long ago: fuser reads `kernel`'s INIT from a socket and
/// answers it there, and the socket's descriptor then becomes `device`.
pub(crate) fn start<FS: fuser::Filesystem>(
    fs: FS,
    device: OwnedFd,
    kernel: KernelInit,
    config: fuser::Config,
) -> io::Result<fuser::Session<FS>> {
    let (ours, theirs) = UnixDatagram::pair()?;
    ours.send(&kernel.request())?;
    let session = fuser::Session::from_fd(fs, OwnedFd::from(theirs), config.acl, config)?;
    // The answer to an INIT the kernel no longer waits for: read and dropped.
    let mut answer = [0u8; 256];
    ours.recv(&mut answer)?;
    become_device(&session, &device)?;
    Ok(session)
}

/// Makes the descriptor `session` reads the same open device as `device`.
///
/// fuser owns the session's descriptor and offers no way to swap it; its
/// number, though, stays the session's, and `dup3` makes that number name
/// another open file in one step. Nothing reads the session yet.
#[allow(unsafe_code)]
fn become_device<FS: fuser::Filesystem>(
    session: &fuser::Session<FS>,
    device: &OwnedFd,
) -> io::Result<()> {
    let number = session.as_fd().as_raw_fd();
    // SAFETY: both numbers are open for the whole call: `device` is
    // borrowed, and `number` is owned by `session`, which is borrowed and
    // which goes on owning it. dup3 replaces what `number` names, closing
    // the socket it named, and takes no pointers.
    let done = unsafe { libc::dup3(device.as_raw_fd(), number, libc::O_CLOEXEC) };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_init_is_rebuilt_as_the_kernel_lays_it_out() {
        let init = KernelInit {
            major: 7,
            minor: 41,
            max_readahead: 131072,
            flags: (1 << 37) | (1 << 3),
        };
        let bytes = init.request();
        let word = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
        assert_eq!(bytes.len(), 104);
        assert_eq!(word(0), 104, "the header's length is the whole request");
        assert_eq!(word(4), opcode::INIT);
        assert_eq!((word(40), word(44), word(48)), (7, 41, 131072));
        assert_eq!(word(52), (1 << 3) | (1 << 30), "low flags, and INIT_EXT");
        assert_eq!(word(56), 1 << 5, "bit 37 in flags2");
        let low = KernelInit {
            flags: 1 << 3,
            ..init
        }
        .request();
        assert_eq!(&low[52..56], &(1u32 << 3).to_ne_bytes(), "no INIT_EXT");
    }
}
