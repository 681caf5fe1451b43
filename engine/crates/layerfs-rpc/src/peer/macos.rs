//! macOS: the owner of a TCP socket, from the kernel's table of TCP
//! sockets (`sysctl net.inet.tcp.pcblist_n`, the one `netstat` reads).
//!
//! The table is a header (`struct xinpgen`) and, for each socket, a run of
//! records, each starting with its length and kind: the connection's
//! addresses (`xinpcb_n`), then the socket (`xsocket_n`: its owner's uid,
//! and the last process that used it), then buffers and statistics that do
//! not matter here. The layouts are XNU's (`bsd/netinet/in_pcb.h`,
//! `bsd/sys/socketvar.h`, packed to 4 bytes); records are 8-byte aligned.
//!
//! A socket the kernel made for itself (`sock_socket`, as its NFS client
//! does) keeps a last pid of 0 for its whole life; every socket a process
//! made carries that process's pid.

use std::net::SocketAddr;

/// What the table says of one socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Socket {
    /// The uid of the credential the socket was made with.
    pub uid: u32,
    /// The last process that used it: 0 for the kernel's own sockets.
    pub last_pid: i32,
}

/// `struct xinpgen`: the table's header and trailer.
const HEADER_LEN: usize = 24;
const XSO_SOCKET: u32 = 0x001;
const XSO_INPCB: u32 = 0x010;
const INP_IPV4: u8 = 0x1;
const INP_IPV6: u8 = 0x2;

/// Offsets in `struct xinpcb_n`.
mod inpcb {
    pub const FPORT: usize = 16;
    pub const LPORT: usize = 18;
    pub const VFLAG: usize = 44;
    /// A 16-byte union: an IPv6 address, or an IPv4 one in its last 4.
    pub const FADDR: usize = 48;
    pub const LADDR: usize = 64;
    pub const LEN: usize = 80;
}

/// Offsets in `struct xsocket_n`.
mod socket {
    pub const UID: usize = 64;
    pub const LAST_PID: usize = 68;
    pub const LEN: usize = 72;
}

/// The socket in `table` whose own end is `from` and whose other end is `to`.
pub fn find(table: &[u8], from: SocketAddr, to: SocketAddr) -> Option<Socket> {
    let mut at = round8(u32_at(table, 0)? as usize).max(HEADER_LEN);
    let mut addresses_match = false;
    while let (Some(len), Some(kind)) = (u32_at(table, at), u32_at(table, at + 4)) {
        let len = len as usize;
        if len <= HEADER_LEN {
            break; // the trailer
        }
        let record = table.get(at..at.checked_add(len)?)?;
        match kind {
            XSO_INPCB => addresses_match = connects(record, from, to),
            XSO_SOCKET if addresses_match => {
                return (len >= socket::LEN).then(|| Socket {
                    uid: u32_at(record, socket::UID).expect("within the record"),
                    last_pid: u32_at(record, socket::LAST_PID).expect("within the record") as i32,
                });
            }
            _ => {}
        }
        at = at.checked_add(round8(len))?;
    }
    None
}

/// Whether the `xinpcb_n` in `record` is the end `from` connected to `to`.
fn connects(record: &[u8], from: SocketAddr, to: SocketAddr) -> bool {
    if record.len() < inpcb::LEN {
        return false;
    }
    let port = |at: usize| u16::from_be_bytes([record[at], record[at + 1]]);
    let vflag = record[inpcb::VFLAG];
    let address = |at: usize, of: SocketAddr| match of {
        SocketAddr::V4(a) => vflag & INP_IPV4 != 0 && record[at + 12..at + 16] == a.ip().octets(),
        SocketAddr::V6(a) => vflag & INP_IPV6 != 0 && record[at..at + 16] == a.ip().octets(),
    };
    port(inpcb::LPORT) == from.port()
        && port(inpcb::FPORT) == to.port()
        && address(inpcb::LADDR, from)
        && address(inpcb::FADDR, to)
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let word = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes(word.try_into().expect("4 bytes")))
}

fn round8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The kernel's table of TCP sockets.
#[cfg(target_os = "macos")]
#[allow(unsafe_code)]
pub fn tcp_table() -> std::io::Result<Vec<u8>> {
    use std::io;
    let name = c"net.inet.tcp.pcblist_n";
    // Sockets come and go between asking the size and reading: ask with
    // room to spare, again if that was not enough.
    for _ in 0..4 {
        let mut len = 0usize;
        // SAFETY: a NUL-terminated name; a null buffer asks for the size.
        let asked = unsafe {
            libc::sysctlbyname(
                name.as_ptr(),
                std::ptr::null_mut(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if asked != 0 {
            return Err(io::Error::last_os_error());
        }
        len += len / 4 + 4096;
        let mut table = vec![0u8; len];
        // SAFETY: `table` has `len` writable bytes; the kernel writes at
        // most that many and says how many in `len`.
        let read = unsafe {
            libc::sysctlbyname(
                name.as_ptr(),
                table.as_mut_ptr().cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if read == 0 {
            table.truncate(len);
            return Ok(table);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOMEM) {
            return Err(e);
        }
    }
    Err(io::Error::other("net.inet.tcp.pcblist_n kept growing"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table laid out as XNU lays it out, with `sockets` (own end, other
    /// end, uid, last pid) in that order, each followed by a buffer record
    /// as the kernel adds.
    fn table(sockets: &[(SocketAddr, SocketAddr, u32, i32)]) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_LEN];
        out[..4].copy_from_slice(&(HEADER_LEN as u32).to_ne_bytes());
        let record = |out: &mut Vec<u8>, kind: u32, body: &dyn Fn(&mut [u8]), len: usize| {
            let start = out.len();
            out.resize(start + round8(len), 0);
            let r = &mut out[start..start + len];
            r[..4].copy_from_slice(&(len as u32).to_ne_bytes());
            r[4..8].copy_from_slice(&kind.to_ne_bytes());
            body(r);
        };
        for &(from, to, uid, pid) in sockets {
            let put_addr = |r: &mut [u8], at: usize, a: SocketAddr| match a {
                SocketAddr::V4(a) => r[at + 12..at + 16].copy_from_slice(&a.ip().octets()),
                SocketAddr::V6(a) => r[at..at + 16].copy_from_slice(&a.ip().octets()),
            };
            let inpcb = |r: &mut [u8]| {
                r[inpcb::FPORT..inpcb::FPORT + 2].copy_from_slice(&to.port().to_be_bytes());
                r[inpcb::LPORT..inpcb::LPORT + 2].copy_from_slice(&from.port().to_be_bytes());
                r[inpcb::VFLAG] = if from.is_ipv4() { INP_IPV4 } else { INP_IPV6 };
                put_addr(r, inpcb::FADDR, to);
                put_addr(r, inpcb::LADDR, from);
            };
            record(&mut out, XSO_INPCB, &inpcb, 116);
            let sock = |r: &mut [u8]| {
                r[socket::UID..socket::UID + 4].copy_from_slice(&uid.to_ne_bytes());
                r[socket::LAST_PID..socket::LAST_PID + 4].copy_from_slice(&pid.to_ne_bytes());
            };
            record(&mut out, XSO_SOCKET, &sock, 76);
            record(&mut out, 0x002, &|_| {}, 32);
        }
        let end = out.len();
        out.resize(end + HEADER_LEN, 0);
        out[end..end + 4].copy_from_slice(&(HEADER_LEN as u32).to_ne_bytes());
        out
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_socket_is_found_by_both_its_ends() {
        let (server, client) = (addr("127.0.0.1:2049"), addr("127.0.0.1:1000"));
        let (server6, client6) = (addr("[::1]:2049"), addr("[::1]:1000"));
        let t = table(&[
            (server, client, 501, 90),
            (client, server, 0, 0),
            (client6, server6, 502, 91),
        ]);
        assert_eq!(
            find(&t, client, server),
            Some(Socket {
                uid: 0,
                last_pid: 0
            })
        );
        assert_eq!(
            find(&t, server, client),
            Some(Socket {
                uid: 501,
                last_pid: 90
            })
        );
        assert_eq!(
            find(&t, client6, server6),
            Some(Socket {
                uid: 502,
                last_pid: 91
            })
        );
        // The same ports over the other family, another port, another address.
        assert_eq!(
            find(&t, addr("[::1]:1000"), addr("[::1]:2049")).map(|s| s.uid),
            Some(502)
        );
        assert_eq!(find(&t, addr("127.0.0.1:1001"), server), None);
        assert_eq!(find(&t, addr("127.0.0.2:1000"), server), None);
    }

    #[test]
    fn a_cut_or_garbled_table_finds_nothing_and_never_panics() {
        let (server, client) = (addr("127.0.0.1:2049"), addr("127.0.0.1:1000"));
        let t = table(&[(client, server, 0, 0)]);
        for cut in 0..t.len() {
            let found = find(&t[..cut], client, server);
            assert!(
                found.is_none() || cut >= HEADER_LEN + 120 + 72,
                "cut at {cut}"
            );
        }
        let mut seed = 7u64;
        for _ in 0..2000 {
            let mut garbled = t.clone();
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (seed >> 33) as usize % garbled.len();
            garbled[at] = (seed >> 20) as u8;
            let _ = find(&garbled, client, server);
        }
        assert_eq!(find(&[], client, server), None);
    }
}
