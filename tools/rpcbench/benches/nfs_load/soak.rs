//! A long mixed load on layerfs alone, sampling the server process's resident memory:
//! does the server's memory stay flat while it works?

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use layerfs_rpc::Records;

use crate::servers::Server;
use crate::workloads::{Handles, Workload, MIB};

/// Calls in rotation on one connection: small calls, a listing, 1 MiB READ
/// and WRITE, and a CREATE, RENAME and REMOVE of one file.
fn client(
    addr: SocketAddr,
    handles: &Handles,
    id: u32,
    stop: &AtomicBool,
    (calls, errors): (&AtomicU64, &AtomicU64),
) {
    let mix = [
        Workload::Getattr,
        Workload::Lookup,
        Workload::Read,
        Workload::Write,
        Workload::Create,
        Workload::Rename,
        Workload::Remove,
        Workload::ReaddirPlus,
        Workload::Null,
    ];
    let payload = vec![0x5Au8; MIB];
    let stream = TcpStream::connect(addr).expect("connect");
    let mut out = &stream;
    let mut replies = Records::new(&stream);
    // Each connection its own xids, never repeated: a repeated xid with the
    // same arguments would be answered from the reply cache.
    let base = rpcbench::xid_base();
    let mut n = 0u32;
    while !stop.load(Relaxed) {
        let w = mix[n as usize % mix.len()];
        // CREATE and REMOVE of one round share a name; rounds reuse names.
        let name_round = (n / mix.len() as u32) % 1000;
        let frame = w.call(
            handles,
            &payload,
            base.wrapping_add(n),
            name_round,
            id * 1000,
        );
        out.write_all(&frame).expect("send");
        let reply = replies.next_record().expect("reply").expect("open");
        if !rpcbench::reply_ok(reply.as_bytes()) {
            errors.fetch_add(1, Relaxed);
        }
        calls.fetch_add(1, Relaxed);
        n = n.wrapping_add(1);
    }
}

pub fn run(server: &Server, handles: Arc<Handles>, seconds: u64, connections: u32) {
    let addr = server.nfs;
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..connections)
        .map(|id| {
            let (stop, handles) = (stop.clone(), handles.clone());
            let (calls, errors) = (calls.clone(), errors.clone());
            thread::spawn(move || client(addr, &handles, id, &stop, (&calls, &errors)))
        })
        .collect();
    let start = Instant::now();
    let warmup = Duration::from_secs(30.min(seconds / 5));
    let mut samples = Vec::new();
    println!("| seconds | calls | RSS MiB |");
    println!("|---:|---:|---:|");
    while start.elapsed() < Duration::from_secs(seconds) {
        thread::sleep(Duration::from_secs(10).min(Duration::from_secs(seconds)));
        let rss = server.rss_kib();
        println!(
            "| {} | {} | {:.1} |",
            start.elapsed().as_secs(),
            calls.load(Relaxed),
            rss as f64 / 1024.0
        );
        if start.elapsed() >= warmup {
            samples.push(rss);
        }
    }
    stop.store(true, Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let (lo, hi) = (
        samples.iter().min().copied().unwrap_or(0),
        samples.iter().max().copied().unwrap_or(0),
    );
    println!(
        "\nafter a {}s warm-up: RSS between {:.1} and {:.1} MiB (spread {:.1} MiB) over {} calls on {connections} connections, {} of them errors",
        warmup.as_secs(),
        lo as f64 / 1024.0,
        hi as f64 / 1024.0,
        (hi - lo) as f64 / 1024.0,
        calls.load(Relaxed),
        errors.load(Relaxed)
    );
}
