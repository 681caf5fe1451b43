//! Who owns the other end of a loopback connection: the uid of the socket
//! that connected, as the kernel records it.
//!
//! AUTH_SYS lets a client claim any uid, so a server that trusts it must know
//! who may connect at all. The kernel's NFS client connects from sockets the
//! kernel owns, reported as uid 0; anyone else is a local process, whose
//! socket carries its uid.
//!
//! - Linux: the kernel is asked by the connection's exact 4-tuple over
//!   sock_diag (one netlink round trip), or, where that is unavailable (no
//!   `inet_diag` module), by reading `/proc/net/tcp` or `/proc/net/tcp6`.
//! - macOS: the kernel's table of TCP sockets (`peer/macos.rs`). A socket the
//!   kernel made for itself is reported as uid 0, as Linux reports them. The
//!   table's layout is private to XNU, so it is first checked on a
//!   connection of our own; where that check fails, nobody's owner is known.

use std::io;
use std::net::SocketAddr;

#[cfg(any(target_os = "macos", test))]
#[doc(hidden)]
pub mod macos;

/// The uid owning the socket at `peer` connected to our `local`: `Ok(None)`
/// where the platform cannot say.
pub fn owner(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    #[cfg(target_os = "linux")]
    {
        match linux::by_sock_diag(local, peer) {
            Ok(uid) => Ok(Some(uid)),
            Err(e) => {
                tracing::debug!("sock_diag: {e}; reading /proc/net instead");
                linux::by_proc_net(local, peer).map(Some)
            }
        }
    }
    #[cfg(target_os = "macos")]
    {
        if !macos_table_reads_right() {
            return Ok(None);
        }
        match macos::find(&macos::tcp_table()?, peer, local) {
            Some(socket) if socket.last_pid == 0 => Ok(Some(0)),
            Some(socket) => Ok(Some(socket.uid)),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{peer} is not in net.inet.tcp.pcblist_n"),
            )),
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        let _ = (local, peer);
        Ok(None)
    }
}

/// Whether the table shows a connection this process makes as made by it
/// (its uid and pid): checked once, and said once if not.
#[cfg(target_os = "macos")]
fn macos_table_reads_right() -> bool {
    static CHECKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHECKED.get_or_init(|| {
        let check = || -> io::Result<Option<macos::Socket>> {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
            let to = listener.local_addr()?;
            let client = std::net::TcpStream::connect(to)?;
            let _accepted = listener.accept()?;
            Ok(macos::find(&macos::tcp_table()?, client.local_addr()?, to))
        };
        let me = macos::Socket {
            uid: rustix::process::geteuid().as_raw(),
            last_pid: rustix::process::getpid().as_raw_nonzero().get(),
        };
        match check() {
            Ok(Some(found)) if found == me => true,
            found => {
                tracing::error!(
                    ?found,
                    "cannot tell who owns a local connection on this macOS \
                     (net.inet.tcp.pcblist_n reads otherwise than expected): \
                     every local user is let in"
                );
                false
            }
        }
    })
}

#[cfg(target_os = "linux")]
#[doc(hidden)]
pub mod linux {
    use std::io;
    use std::net::{IpAddr, SocketAddr};

    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket};

    /// Asks for the one socket whose source is `peer` and destination `local`.
    pub fn by_sock_diag(local: SocketAddr, peer: SocketAddr) -> io::Result<u32> {
        let socket = Socket::new(NETLINK_SOCK_DIAG)?;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        let request = InetRequest {
            family: if peer.is_ipv4() { AF_INET } else { AF_INET6 },
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: SocketId {
                source_port: peer.port(),
                destination_port: local.port(),
                source_address: peer.ip(),
                destination_address: local.ip(),
                interface_id: 0,
                // All ones: match by the addresses, not a cookie.
                cookie: [0xff; 8],
            },
        };
        let mut packet = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        socket.send_to(&out, &netlink_sys::SocketAddr::new(0, 0), 0)?;
        let mut reply = Vec::with_capacity(8192);
        socket.recv(&mut reply, 0)?;
        let answer = <NetlinkMessage<SockDiagMessage>>::deserialize(&reply)
            .map_err(|e| io::Error::other(format!("a sock_diag reply that does not parse: {e}")))?;
        match answer.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => Ok(r.header.uid),
            NetlinkPayload::Error(e) => Err(e.to_io()),
            other => Err(io::Error::other(format!(
                "unexpected sock_diag reply: {other:?}"
            ))),
        }
    }

    /// Finds the connection in `/proc/net/tcp` or `/proc/net/tcp6`.
    pub fn by_proc_net(local: SocketAddr, peer: SocketAddr) -> io::Result<u32> {
        let table = if peer.is_ipv4() {
            "/proc/net/tcp"
        } else {
            "/proc/net/tcp6"
        };
        let text = std::fs::read_to_string(table)?;
        find_uid(&text, &proc_addr(peer), &proc_addr(local)).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{peer} is not in {table}"))
        })
    }

    /// An address as `/proc/net/tcp*` prints it: each 32-bit word of the
    /// address in host byte order, in hex, then the port.
    pub fn proc_addr(addr: SocketAddr) -> String {
        let octets: Vec<u8> = match addr.ip() {
            IpAddr::V4(ip) => ip.octets().to_vec(),
            IpAddr::V6(ip) => ip.octets().to_vec(),
        };
        let words: String = octets
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes(w.try_into().expect("4 bytes"))))
            .collect();
        format!("{words}:{:04X}", addr.port())
    }

    /// The uid of the line whose local address is `from` and remote `to`.
    pub fn find_uid(table: &str, from: &str, to: &str) -> Option<u32> {
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(1) == Some(&from) && fields.get(2) == Some(&to))
                .then(|| fields.get(7)?.parse().ok())
                .flatten()
        })
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::linux::*;
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_connection_of_this_process_is_owned_by_its_uid_both_ways() {
        let me = rustix::process::geteuid().as_raw();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let local = accepted.local_addr().unwrap();
        assert_eq!(owner(local, peer).unwrap(), Some(me));
        assert_eq!(by_proc_net(local, peer).unwrap(), me);
        // sock_diag is the way asked first on Linux: it must answer.
        let by_diag = by_sock_diag(local, peer).expect("sock_diag answers for a loopback peer");
        assert_eq!(by_diag, me);
        // A 4-tuple no socket has is not anybody's.
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(by_proc_net(local, nobody).is_err());
        assert!(by_sock_diag(local, nobody).is_err());
    }

    #[test]
    fn proc_net_lines_are_matched_by_both_addresses() {
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:2049".parse().unwrap();
        assert_eq!(proc_addr(peer), "0100007F:9C40");
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
            0: 0100007F:0801 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 1 1\n   \
            1: 0100007F:9C40 0100007F:0801 01 00000000:00000000 00:00000000 00000000 65534        0 2 1\n";
        assert_eq!(
            find_uid(table, &proc_addr(peer), &proc_addr(local)),
            Some(65534)
        );
        assert_eq!(
            find_uid(table, &proc_addr(local), &proc_addr(peer)),
            Some(0)
        );
        let v6: SocketAddr = "[::1]:2049".parse().unwrap();
        assert_eq!(proc_addr(v6), "00000000000000000000000001000000:0801");
    }
}
