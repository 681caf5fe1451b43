//! Who clears setuid, setgid and file capabilities when a file changes.
//!
//! The door asks for `FUSE_HANDLE_KILLPRIV_V2`. The kernel then marks the
//! mount `SB_NOSEC`: it asks for a file's `security.capability` once, and
//! once it knows there is none and no setuid or setgid bit, it stops asking
//! before each write to that inode. Without it every write(2) through the
//! door costs a GETXATTR round trip (4 KiB writes ran 8-23 times slower
//! than on the host file). In exchange the door clears what the kernel no
//! longer does:
//! - a WRITE the kernel marks `FUSE_WRITE_KILL_SUIDGID` (its writer lacks
//!   `CAP_FSETID`) first drops setuid, and setgid with group execute
//!   ([`crate::door`]);
//! - a truncate by a caller other than root drops them by the filesystem's
//!   own rules (`hostdir::check_setattr`), and a chown by the host's (the
//!   door's chown of the host file clears them);
//! - capabilities go in the host's own write path, which the door's and
//!   passthrough's writes both take;
//! - a file with setuid or setgid is never passed through. One that gains
//!   a bit while open gets the empty SETATTR before its next write, as
//!   long as the kernel knows of the bit: it does where every change
//!   passes through the door (`Caching::Exclusive`). Where other programs
//!   change the files (`Caching::Shared`), the kernel may not know, and its
//!   write through passthrough is made with the credentials of the thread
//!   that registered the backing file; those are registered without
//!   `CAP_FSETID` ([`without_fsetid`]), so the host drops the bits as it
//!   would for a caller without privilege (`tests/fuse/door.sh`). Not
//!   everywhere: the two `capset` per registration made `cp -r` of 20,000
//!   files 9% slower (2.63 s against 2.41 s, median of 6 interleaved
//!   rounds).

use std::cell::Cell;
use std::io;

use rustix::thread::{capabilities, set_capabilities, CapabilitySet, CapabilitySets};

thread_local! {
    /// This thread's capabilities, asked once: nothing else changes them.
    static HELD: Cell<Option<CapabilitySets>> = const { Cell::new(None) };
}

/// Runs `f` on this thread with `CAP_FSETID` out of its effective set, and
/// puts it back after.
pub fn without_fsetid<T>(f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let held = match HELD.get() {
        Some(held) => held,
        None => {
            let held = capabilities(None)?;
            HELD.set(Some(held));
            held
        }
    };
    if !held.effective.contains(CapabilitySet::FSETID) {
        return f();
    }
    let mut lesser = held;
    lesser.effective.remove(CapabilitySet::FSETID);
    set_capabilities(None, lesser)?;
    let result = f();
    // Restoring a subset of the permitted set the thread had a moment ago
    // cannot be refused; if it were, the thread would only clear more
    // setuid bits than it should.
    if let Err(e) = set_capabilities(None, held) {
        tracing::error!("a FUSE thread could not take CAP_FSETID back: {e}");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capability_is_out_only_while_f_runs() {
        let before = capabilities(None).unwrap();
        // Without it there is nothing to take out.
        let held = match before.effective.contains(CapabilitySet::FSETID) {
            true => Ok(()),
            false => Err("this process has no CAP_FSETID (run as root)".to_string()),
        };
        if layerfs_testkit::or_skip(held, "CAP_FSETID out while a backing file is registered")
            .is_none()
        {
            return;
        }
        let inside = without_fsetid(|| Ok(capabilities(None)?)).unwrap();
        assert!(!inside.effective.contains(CapabilitySet::FSETID));
        assert_eq!(inside.permitted, before.permitted);
        assert_eq!(capabilities(None).unwrap(), before);
    }
}
