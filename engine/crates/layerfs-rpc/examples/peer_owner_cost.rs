//! What finding a connection's owner costs per accept: over sock_diag and by
//! reading /proc/net/tcp, with few and with 1,000 other open connections.
//!
//!     cargo run --release -p layerfs-rpc --example peer_owner_cost

#[cfg(target_os = "linux")]
fn main() {
    use layerfs_rpc::peer::linux::{by_proc_net, by_sock_diag};
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut kept = Vec::new();
    for others in [0usize, 1000] {
        while kept.len() < others * 2 {
            let c = TcpStream::connect(addr).unwrap();
            let (s, _) = listener.accept().unwrap();
            kept.push(c);
            kept.push(s);
        }
        let _client = TcpStream::connect(addr).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let local = accepted.local_addr().unwrap();
        const N: u32 = 2000;
        let t = Instant::now();
        for _ in 0..N {
            by_sock_diag(local, peer).unwrap();
        }
        let diag = t.elapsed() / N;
        let t = Instant::now();
        for _ in 0..N / 10 {
            by_proc_net(local, peer).unwrap();
        }
        let proc_net = t.elapsed() / (N / 10);
        println!("{others:>5} other connections: sock_diag {diag:?}, /proc/net/tcp {proc_net:?} per accept");
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    println!("owners of connections are found on Linux only");
}
