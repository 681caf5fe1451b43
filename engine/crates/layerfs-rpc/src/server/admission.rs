//! Who may connect, and room for a new connection: decided at accept,
//! before a byte of it is read.

use std::net::{Shutdown, SocketAddr, TcpListener};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

use super::connection::{serve_connection, Connection};
use super::Shared;

/// Who may connect over loopback, decided at accept, before a byte is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Anyone,
    /// Only sockets owned by one of these uids (the kernel's NFS client's
    /// are root's), as the kernel records them ([`crate::peer::owner`]). A
    /// connection whose owner cannot be found is refused; one from another
    /// host is not checked (no local uid owns it). Where the platform cannot
    /// tell owners (not Linux or macOS, or a macOS whose socket table reads
    /// otherwise than expected), everyone is let in.
    Uids(Vec<u32>),
}

impl Admission {
    /// Whether the connection from `peer` to our `local` may stay open.
    fn admits(&self, local: SocketAddr, peer: SocketAddr) -> bool {
        let Admission::Uids(uids) = self else {
            return true;
        };
        if !peer.ip().is_loopback() {
            return true;
        }
        match crate::peer::owner(local, peer) {
            Ok(Some(uid)) if uids.contains(&uid) => true,
            Ok(Some(uid)) => {
                tracing::warn!(%peer, uid, "refused a connection from a local user not allowed in");
                false
            }
            Ok(None) => true,
            Err(e) => {
                tracing::warn!(%peer, "refused a connection whose owner is unknown: {e}");
                false
            }
        }
    }
}

impl Shared {
    /// Whether a new connection from `peer` may open: below the limit, or
    /// once the connection idle the longest is on its way out.
    fn make_room(&self, peer: SocketAddr) -> bool {
        let live: Vec<Arc<Connection>> = self
            .live
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| !c.evicted.load(Relaxed))
            .collect();
        if live.len() < self.config.max_connections {
            return true;
        }
        let idle = live
            .iter()
            .filter(|c| !c.window.is_busy())
            .min_by_key(|c| c.last_call.load(Relaxed));
        match idle {
            Some(oldest) => {
                tracing::info!(
                    closed = %oldest.addr, %peer,
                    "{} connections open: closing the one idle the longest", live.len()
                );
                oldest.evicted.store(true, Relaxed);
                // Its reader sees the end of the stream and winds it down.
                let _ = oldest.stream.shutdown(Shutdown::Read);
                true
            }
            None => {
                tracing::warn!(%peer, "{} connections open, all busy: refused", live.len());
                false
            }
        }
    }
}

pub(super) fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Relaxed) {
            return;
        }
        match accepted {
            Ok((stream, peer)) => {
                let admitted = stream
                    .local_addr()
                    .is_ok_and(|local| shared.config.admit.admits(local, peer));
                if !admitted || !shared.make_room(peer) {
                    // Closed before a byte of it is read.
                    continue;
                }
                let for_reader = shared.clone();
                let spawned = thread::Builder::new()
                    .name(format!("rpc-conn-{peer}"))
                    .spawn(move || serve_connection(stream, peer, &for_reader));
                match spawned {
                    Ok(reader) => {
                        let mut readers = shared.readers.lock();
                        readers.retain(|r| !r.is_finished());
                        readers.push(reader);
                    }
                    Err(e) => tracing::error!(%peer, "cannot start a connection thread: {e}"),
                }
            }
            Err(e) => {
                // Out of descriptors or a connection reset before accept: keep
                // listening, but do not spin while the cause persists.
                tracing::warn!("accept failed: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}
