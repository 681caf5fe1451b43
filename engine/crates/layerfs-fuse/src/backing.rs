//! Backing files registered with the kernel for passthrough opens.
//!
//! A [`Backing`] is registered and closed on the connection's device
//! itself, whichever thread or ring answered the open.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::ioctl::{ioctl, Setter};

use crate::abi::{BackingMap, DEV_IOC_BACKING_CLOSE, DEV_IOC_BACKING_OPEN};

/// A host file the kernel reads and writes for an inode's passthrough
/// opens, until this is dropped.
#[derive(Debug)]
pub struct Backing {
    id: u32,
    device: Arc<OwnedFd>,
}

impl Backing {
    /// Registers `file` with the session of `device`.
    #[allow(unsafe_code)]
    pub fn register(device: &Arc<OwnedFd>, file: BorrowedFd<'_>) -> io::Result<Backing> {
        let map = BackingMap {
            fd: file.as_raw_fd(),
            ..BackingMap::default()
        };
        // SAFETY: the ioctl reads one `struct fuse_backing_map` from a live
        // local, and both descriptors are open; it returns the id.
        let id = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                DEV_IOC_BACKING_OPEN as _,
                &map as *const BackingMap,
            )
        };
        if id < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Backing {
            id: id as u32,
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
