//! One FUSE connection: its device, what the kernel's INIT offered and what
//! the door agreed to. Made once, by the door answering the INIT itself
//! ([`Connection::start`]) or, for a session another server started, from
//! the INIT it kept ([`Connection::resume`]); every door and ring of the
//! mount is built from it, and nothing in it changes after.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use zerocopy::{FromBytes, IntoBytes};

use crate::abi::{
    init, opcode, InHeader, InitIn, InitOut, NotifyInvalEntryOut, NotifyInvalInodeOut, OutHeader,
    ANSWERED_MINOR_VERSION, KERNEL_VERSION, NOTIFY_INVAL_ENTRY, NOTIFY_INVAL_INODE,
};
use crate::attrs::Caching;
use crate::limits::largest_read;

/// What the kernel's FUSE_INIT offered a session: kept with its device so
/// that the next server agrees to the same settings (passthrough,
/// writeback cache, the rings) the first did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInit {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// The capabilities offered (`flags` and `flags2` as one word),
    /// FUSE_OVER_IO_URING only where the door asked for the rings.
    pub flags: u64,
}

/// What a door asks of the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Wants {
    pub caching: Caching,
    /// Passthrough, where the door runs as root (registering backing
    /// files needs CAP_SYS_ADMIN).
    pub passthrough: bool,
    /// FUSE over io_uring.
    pub rings: bool,
}

/// What the door agreed to at INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    /// The capabilities asked for and offered.
    pub flags: u64,
    pub max_write: u32,
    pub max_readahead: u32,
}

impl Agreed {
    pub fn passthrough(&self) -> bool {
        self.flags & init::PASSTHROUGH != 0
    }

    pub fn rings(&self) -> bool {
        self.flags & init::OVER_IO_URING != 0
    }
}

/// A mount's FUSE connection, its INIT answered.
#[derive(Debug)]
pub struct Connection {
    device: Arc<OwnedFd>,
    kernel: KernelInit,
    agreed: Agreed,
}

impl Connection {
    /// Answers the kernel's INIT on `device`, a connection just mounted:
    /// the first request the kernel sends on it.
    pub fn start(device: OwnedFd, wants: Wants) -> io::Result<Connection> {
        // The kernel refuses a read into less than FUSE_MIN_READ_BUFFER
        // (8 KiB), whatever the request.
        let mut buf = vec![0u8; 8192];
        loop {
            let len = loop {
                match rustix::io::read(&device, &mut buf) {
                    Ok(len) => break len,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            let (header, rest) = InHeader::read_from_prefix(&buf[..len])
                .map_err(|_| io::Error::other("the kernel's first FUSE request is cut short"))?;
            if header.opcode != opcode::INIT {
                answer(&device, header.unique, -libc::EIO, &[])?;
                return Err(io::Error::other(format!(
                    "the kernel's first FUSE request is {}, not INIT",
                    header.opcode
                )));
            }
            let (offer, _) = InitIn::read_from_prefix(rest)
                .map_err(|_| io::Error::other("the kernel's FUSE INIT is cut short"))?;
            if offer.major > KERNEL_VERSION {
                // A newer kernel asks again at the version it is told.
                let ours = InitOut {
                    major: KERNEL_VERSION,
                    minor: ANSWERED_MINOR_VERSION,
                    ..InitOut::default()
                };
                answer(&device, header.unique, 0, ours.as_bytes())?;
                continue;
            }
            if offer.major < KERNEL_VERSION || offer.minor < 6 {
                answer(&device, header.unique, -libc::EPROTO, &[])?;
                return Err(io::Error::other(format!(
                    "the kernel speaks FUSE {}.{}, older than 7.6",
                    offer.major, offer.minor
                )));
            }
            let kernel = KernelInit::offered(&offer, wants);
            let (agreed, out) = agree(kernel, wants);
            let out = out.as_bytes();
            // A kernel before 7.23 reads the answer's first 24 bytes.
            let out = if offer.minor < 23 { &out[..24] } else { out };
            answer(&device, header.unique, 0, out)?;
            tracing::info!(
                passthrough = agreed.passthrough(),
                "FUSE session starts: ABI {}.{}, capabilities {:#x}",
                offer.major,
                offer.minor,
                agreed.flags
            );
            return Ok(Connection {
                device: Arc::new(device),
                kernel,
                agreed,
            });
        }
    }

    /// The connection of `device`, whose INIT another server answered as
    /// `kernel` offered: agreed again by the same rule, so to what that
    /// server agreed.
    pub fn resume(device: OwnedFd, kernel: KernelInit, wants: Wants) -> Connection {
        let (agreed, _) = agree(kernel, wants);
        Connection {
            device: Arc::new(device),
            kernel,
            agreed,
        }
    }

    pub fn device(&self) -> &Arc<OwnedFd> {
        &self.device
    }

    pub fn kernel(&self) -> KernelInit {
        self.kernel
    }

    pub fn agreed(&self) -> Agreed {
        self.agreed
    }

    /// Tells the kernel to drop what it holds of `name` in directory
    /// `parent` (an inode number). What it does not hold is no error.
    pub fn forget_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        let entry = NotifyInvalEntryOut {
            parent,
            namelen: name.len() as u32,
            flags: 0,
        };
        notify(
            &*self.device,
            NOTIFY_INVAL_ENTRY,
            &[entry.as_bytes(), name, b"\0"],
        )
    }

    /// Tells the kernel to drop the attributes and pages it holds of inode
    /// `ino` (with `pages` false, the attributes alone).
    pub fn forget_inode(&self, ino: u64, pages: bool) -> io::Result<()> {
        let inode = NotifyInvalInodeOut {
            ino,
            off: if pages { 0 } else { -1 },
            len: 0,
        };
        notify(&*self.device, NOTIFY_INVAL_INODE, &[inode.as_bytes()])
    }
}

impl KernelInit {
    /// What `offer` says, the rings left out unless `wants` asks for them:
    /// the next server of the session serves the rings exactly when this
    /// one does (see [`crate::mount::resume`]).
    fn offered(offer: &InitIn, wants: Wants) -> KernelInit {
        let mut flags = offer.flags as u64;
        if flags & init::EXT != 0 {
            flags = (flags & !init::EXT) | (offer.flags2 as u64) << 32;
        }
        if !wants.rings {
            flags &= !init::OVER_IO_URING;
        }
        KernelInit {
            major: offer.major,
            minor: offer.minor,
            max_readahead: offer.max_readahead,
            flags,
        }
    }
}

/// What the door asks for of what `kernel` offers, and the INIT answer
/// that says so.
fn agree(kernel: KernelInit, wants: Wants) -> (Agreed, InitOut) {
    let offered = kernel.flags;
    let has = |flag: u64| offered & flag != 0;
    let mut asked = init::ASYNC_READ | init::BIG_WRITES;
    // Passthrough needs CAP_SYS_ADMIN to register backing files, and the
    // kernel turns it off beside a writeback cache. Where it is on, the
    // kernel reads and writes host files itself; elsewhere the writeback
    // cache batches small writes into large ones.
    let passthrough = wants.passthrough && has(init::PASSTHROUGH);
    if passthrough {
        asked |= init::PASSTHROUGH;
    }
    // READDIRPLUS on every listing, not only the first page of one: a
    // listing is nearly always followed by a stat of each entry. With
    // HANDLE_KILLPRIV_V2 the kernel sends no GETXATTR before every write;
    // the door clears setuid and setgid instead (see [`crate::privilege`]).
    asked |= init::DO_READDIRPLUS
        | init::PARALLEL_DIROPS
        | init::CACHE_SYMLINKS
        | init::MAX_PAGES
        | init::HANDLE_KILLPRIV_V2;
    if wants.rings {
        asked |= init::OVER_IO_URING;
    }
    asked |= match wants.caching {
        Caching::Exclusive if !passthrough => init::WRITEBACK_CACHE,
        Caching::Exclusive => 0,
        Caching::Shared => init::AUTO_INVAL_DATA,
    };
    for (flag, name) in [
        (init::DO_READDIRPLUS, "DO_READDIRPLUS"),
        (init::PARALLEL_DIROPS, "PARALLEL_DIROPS"),
        (init::CACHE_SYMLINKS, "CACHE_SYMLINKS"),
        (init::HANDLE_KILLPRIV_V2, "HANDLE_KILLPRIV_V2"),
        (init::WRITEBACK_CACHE, "WRITEBACK_CACHE"),
        (init::AUTO_INVAL_DATA, "AUTO_INVAL_DATA"),
    ] {
        if asked & flag != 0 && !has(flag) {
            tracing::info!("the kernel does not offer FUSE capability {name}");
        }
    }
    let flags = asked & offered;
    // No READ larger than a pipe of this process carries whole
    // (`devfuse/splice.rs`): the kernel cuts READs, and WRITEs, at the
    // larger of the two; its readahead no larger than it allows.
    let largest = largest_read() as u32;
    let max_readahead = match largest <= kernel.max_readahead {
        true => largest,
        false => kernel.max_readahead,
    };
    let page = rustix::param::page_size() as u32;
    // Enough background requests in flight to keep readahead and
    // writeback streaming; the kernel's default of 12 stalls them.
    let max_background = 64;
    // INIT_EXT where there are bits for flags2 (the kernel offered them in
    // it, so it reads it).
    let reply_flags = match flags >> 32 {
        0 => flags,
        _ => flags | init::EXT,
    };
    let out = InitOut {
        major: KERNEL_VERSION,
        minor: ANSWERED_MINOR_VERSION,
        max_readahead,
        flags: reply_flags as u32,
        max_background,
        congestion_threshold: max_background * 3 / 4,
        max_write: largest,
        time_gran: 1,
        max_pages: ((largest.max(max_readahead) - 1) / page + 1) as u16,
        flags2: (reply_flags >> 32) as u32,
        max_stack_depth: if passthrough { 1 } else { 0 },
        ..InitOut::default()
    };
    let agreed = Agreed {
        flags,
        max_write: largest,
        max_readahead,
    };
    (agreed, out)
}

/// Writes the answer to request `unique`: error `error` (negative), or
/// `body`.
fn answer(device: impl AsFd, unique: u64, error: i32, body: &[u8]) -> io::Result<()> {
    let header = OutHeader {
        len: (size_of::<OutHeader>() + body.len()) as u32,
        error,
        unique,
    };
    write_all(device, &[header.as_bytes(), body])
}

/// Writes notification `code` of `parts`.
fn notify(device: impl AsFd, code: i32, parts: &[&[u8]]) -> io::Result<()> {
    let len = size_of::<OutHeader>() + parts.iter().map(|p| p.len()).sum::<usize>();
    let header = OutHeader {
        len: len as u32,
        error: code,
        unique: 0,
    };
    let mut all = vec![header.as_bytes()];
    all.extend_from_slice(parts);
    match write_all(device, &all) {
        // Nothing of it is cached: nothing to drop.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// One message to the device, written whole in one call as the kernel
/// takes it.
fn write_all(device: impl AsFd, parts: &[&[u8]]) -> io::Result<()> {
    let slices: Vec<std::io::IoSlice<'_>> =
        parts.iter().map(|p| std::io::IoSlice::new(p)).collect();
    loop {
        match rustix::io::writev(&device, &slices) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(flags: u64) -> KernelInit {
        KernelInit {
            major: 7,
            minor: 41,
            max_readahead: 128 * 1024,
            flags,
        }
    }

    const EVERYTHING: u64 = init::ASYNC_READ
        | init::BIG_WRITES
        | init::AUTO_INVAL_DATA
        | init::DO_READDIRPLUS
        | init::WRITEBACK_CACHE
        | init::PARALLEL_DIROPS
        | init::MAX_PAGES
        | init::CACHE_SYMLINKS
        | init::HANDLE_KILLPRIV_V2
        | init::PASSTHROUGH
        | init::OVER_IO_URING;

    #[test]
    fn passthrough_is_agreed_where_asked_and_offered_and_then_no_writeback_cache() {
        let wants = Wants {
            caching: Caching::Exclusive,
            passthrough: true,
            rings: false,
        };
        let (agreed, out) = agree(offer(EVERYTHING), wants);
        assert!(agreed.passthrough());
        assert_eq!(agreed.flags & init::WRITEBACK_CACHE, 0);
        assert_eq!(out.max_stack_depth, 1);
        assert_eq!(out.flags2 as u64, init::PASSTHROUGH >> 32);
        assert_ne!(out.flags as u64 & init::EXT, 0, "flags2 said to hold bits");
        let user = Wants {
            passthrough: false,
            ..wants
        };
        let (agreed, out) = agree(offer(EVERYTHING), user);
        assert!(!agreed.passthrough());
        assert_ne!(agreed.flags & init::WRITEBACK_CACHE, 0);
        assert_eq!(out.max_stack_depth, 0);
    }

    #[test]
    fn nothing_is_agreed_that_was_not_offered() {
        let wants = Wants {
            caching: Caching::Shared,
            passthrough: true,
            rings: true,
        };
        let few = init::ASYNC_READ | init::DO_READDIRPLUS;
        let (agreed, out) = agree(offer(few), wants);
        assert_eq!(agreed.flags, few);
        assert_eq!(
            out.flags as u64, few,
            "no INIT_EXT where the kernel sent none"
        );
        assert_eq!(out.flags2, 0);
        assert!(!agreed.passthrough() && !agreed.rings());
    }

    #[test]
    fn sizes_stay_within_what_the_kernel_and_a_pipe_allow() {
        let wants = Wants {
            caching: Caching::Shared,
            passthrough: false,
            rings: false,
        };
        let small = KernelInit {
            max_readahead: 4096,
            ..offer(EVERYTHING)
        };
        let (agreed, out) = agree(small, wants);
        assert_eq!(agreed.max_readahead, 4096);
        assert_eq!(out.max_write, largest_read() as u32);
        assert!(out.max_pages as usize * rustix::param::page_size() >= largest_read());
        assert_eq!((out.max_background, out.congestion_threshold), (64, 48));
    }

    #[test]
    fn the_rings_are_kept_in_the_offer_only_where_asked_for() {
        let offer_in = InitIn {
            major: 7,
            minor: 42,
            max_readahead: 1 << 20,
            flags: (init::EXT | init::ASYNC_READ) as u32,
            flags2: ((init::OVER_IO_URING | init::PASSTHROUGH) >> 32) as u32,
            ..InitIn::default()
        };
        let mut wants = Wants {
            caching: Caching::Shared,
            passthrough: false,
            rings: false,
        };
        let kept = KernelInit::offered(&offer_in, wants);
        assert_eq!(kept.flags & init::OVER_IO_URING, 0);
        assert_ne!(kept.flags & init::PASSTHROUGH, 0);
        assert_eq!(kept.flags & init::EXT, 0, "flags2 is in the word itself");
        wants.rings = true;
        let kept = KernelInit::offered(&offer_in, wants);
        assert_ne!(kept.flags & init::OVER_IO_URING, 0);
        assert!(agree(kept, wants).0.rings());
    }
}
