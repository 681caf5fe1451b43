//! Backing files registered with the kernel for passthrough opens.
//!
//! fuser's own `BackingId` closes its registration through the descriptor
//! of the session that answered the open; a session fed through a socket
//! (a CPU's ring, see [`crate::uring`]) has no device to close it on. A
//! [`Backing`] is registered and closed on the session's device itself,
//! whichever session answers.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::ioctl::{ioctl, Setter};

use crate::abi::DEV_IOC_BACKING_CLOSE;

/// A host file the kernel reads and writes for an inode's passthrough
/// opens, until this is dropped.
#[derive(Debug)]
pub struct Backing {
    id: u32,
    device: Arc<OwnedFd>,
}

impl Backing {
    /// Registers `file` with the session of `device`.
    pub fn register(device: &Arc<OwnedFd>, file: BorrowedFd<'_>) -> io::Result<Backing> {
        let id = fuser::BackingId::create_raw(device.as_fd(), file)?;
        Ok(Backing {
            id,
            device: device.clone(),
        })
    }

    /// The registration `id` another server of the session made, which
    /// this one closes when it is dropped.
    pub fn adopt(device: &Arc<OwnedFd>, id: u32) -> Backing {
        Backing {
            id,
            device: device.clone(),
        }
    }
}

impl crate::opens::Registered for Backing {
    /// The kernel's number for it, as an open's answer carries it.
    fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Backing {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: DEV_IOC_BACKING_CLOSE reads one u32 through the pointer Setter
        // passes, which lives for the call.
        let closed = unsafe {
            ioctl(
                &self.device,
                Setter::<DEV_IOC_BACKING_CLOSE, u32>::new(self.id),
            )
        };
        if let Err(e) = closed {
            // The session is gone (its registrations with it).
            tracing::debug!("backing file {} not closed: {e}", self.id);
        }
    }
}
