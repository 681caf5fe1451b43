//! layerfs next to the peer servers `nfs3_server` and `nfsserve`, and the raw
//! TCP floor, in one run: small calls, directory listing, 1 MiB READ and
//! WRITE, and CREATE/REMOVE, each on one connection at depth 1 and 32.
//!
//! Run: `cargo bench -p rpcbench --bench nfs_load -- [--seconds S] [--rounds N]
//! [--only NAME] [--svg PATH] [--export-in DIR]` (layerfs' export goes in
//! /dev/shm unless --export-in names another directory). With `--soak S`,
//! instead: a mixed load on layerfs alone for S seconds, sampling memory.

mod memfs;
mod peers;
mod report;
mod soak;
mod workloads;

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use layerfs_rpc::TransportStats;
use rpcbench::{run_load, spawn_floor, LoadResult};
use workloads::{Handles, Workload, MIB};

pub struct Row {
    pub workload: Workload,
    pub server: &'static str,
    pub depth: usize,
    pub load: LoadResult,
    /// layerfs only: its transport counters over the run.
    pub transport: Option<TransportStats>,
}

struct Target {
    name: &'static str,
    addr: SocketAddr,
    handles: Option<Handles>,
}

fn main() {
    let mut seconds = 2.0;
    let mut rounds = 3;
    let mut only: Option<String> = None;
    let mut soak: Option<u64> = None;
    // The peers keep their data in memory; by default so does layerfs
    // (a tmpfs), so the comparison is of servers, not of disks.
    let mut export_in = std::path::PathBuf::from(if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    });
    let mut svg = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/benchmarks.svg").to_string();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--seconds S")
            }
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .expect("--rounds N")
            }
            "--only" => only = args.next(),
            "--soak" => soak = args.next().and_then(|s| s.parse().ok()),
            "--svg" => svg = args.next().expect("--svg PATH"),
            "--export-in" => export_in = args.next().expect("--export-in DIR").into(),
            _ => {}
        }
    }
    let duration = Duration::from_secs_f64(seconds);
    eprintln!("preparing the data on every server ...");
    let export = tempfile::tempdir_in(&export_in).expect("temporary export");
    eprintln!("layerfs serves {}", export.path().display());
    peers::fill_dir(export.path());
    let layerfs = peers::spawn_layerfs(export.path());
    if let Some(seconds) = soak {
        let handles = Handles::of(layerfs.local_addr()).expect("layerfs handles");
        println!("mixed load on layerfs for {seconds} s, resident memory of the process (server and client):\n");
        soak::run(
            layerfs.local_addr(),
            std::sync::Arc::new(handles),
            seconds,
            8,
        );
        return;
    }
    let mut targets: Vec<Target> = vec![
        Target {
            name: "layerfs",
            addr: layerfs.local_addr(),
            handles: None,
        },
        Target {
            name: "nfs3_server",
            addr: peers::spawn_nfs3_server(),
            handles: None,
        },
        Target {
            name: "nfsserve",
            addr: peers::spawn_nfsserve(),
            handles: None,
        },
    ];
    for t in &mut targets {
        t.handles = Some(Handles::of(t.addr).unwrap_or_else(|e| panic!("{}: {e}", t.name)));
    }
    let floor_small = spawn_floor(report::null_reply()).expect("floor");
    let floor_read = spawn_floor(report::reply_of(MIB)).expect("floor");
    let payload = vec![0xA5u8; MIB];

    let workloads: Vec<Workload> = Workload::ALL
        .into_iter()
        .filter(|w| {
            only.as_deref()
                .is_none_or(|o| w.name().to_lowercase().starts_with(&o.to_lowercase()))
        })
        .collect();
    let mut runs = Vec::new();
    for round in 0..rounds {
        for &w in &workloads {
            for depth in [1usize, 32] {
                eprintln!(
                    "round {}/{rounds}: {} at depth {depth}",
                    round + 1,
                    w.name()
                );
                for t in &targets {
                    let h = t.handles.as_ref().expect("handles");
                    if round == 0 && depth == 1 {
                        if let Err(e) = w.check(t.addr, h) {
                            eprintln!("  {}: {e} (its numbers below measure errors)", t.name);
                        }
                    }
                    let before = (t.name == "layerfs").then(|| layerfs.stats());
                    let (warmup, max) = match w.fixed_calls() {
                        Some(n) => (0, n),
                        None => (if w.bytes().is_some() { 20 } else { 2000 }, 5_000_000),
                    };
                    // CREATE names restart each round; REMOVE follows CREATE.
                    let base = 100_000 * round as u32 + if depth == 32 { 50_000 } else { 0 };
                    let load = run_load(t.addr, depth, warmup, duration, max, |xid, seq| {
                        w.call(h, &payload, xid, seq, base)
                    })
                    .unwrap_or_else(|e| panic!("{} {}: {e}", t.name, w.name()));
                    if load.errors > 0 {
                        eprintln!(
                            "  {}: {} of its {} replies were errors (its numbers measure them)",
                            t.name,
                            load.errors,
                            w.name()
                        );
                    }
                    thread::sleep(Duration::from_millis(50));
                    let transport = before.map(|b| report::delta(&layerfs.stats(), &b));
                    runs.push(Row {
                        workload: w,
                        server: t.name,
                        depth,
                        load,
                        transport,
                    });
                }
                let floor = match w {
                    Workload::Read => Some(floor_read),
                    Workload::Null => Some(floor_small),
                    _ => None,
                };
                if let Some(addr) = floor {
                    let load = run_load(addr, depth, 20, duration, 5_000_000, |xid, seq| {
                        w.call(targets[0].handles.as_ref().unwrap(), &payload, xid, seq, 0)
                    })
                    .expect("floor run");
                    runs.push(Row {
                        workload: w,
                        server: "tcp floor",
                        depth,
                        load,
                        transport: None,
                    });
                }
            }
        }
    }
    let rows = report::medians(&runs);
    println!("{rounds} round(s) of {seconds} s per workload, server and depth (CREATE and REMOVE: 2,000 calls); median round shown\n");
    report::print(&rows);
    if only.is_some() {
        return; // a partial run does not replace the chart
    }
    if let Err(e) = std::fs::write(&svg, report::svg(&rows)) {
        eprintln!("cannot write {svg}: {e}");
    } else {
        eprintln!("chart written to {svg}");
    }
}
