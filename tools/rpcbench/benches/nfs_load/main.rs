//! layerfs next to nfs-ganesha and the peer servers `nfs3_server` and
//! `nfsserve`, and the raw TCP floor, in one run: every server in a process
//! of its own, this program the load generator. Small calls, directory
//! listings, READ and WRITE of 1 MiB and 32 KiB, a GETATTR amid 1 MiB
//! WRITEs, and the calls that change names, each on one connection at two
//! depths; layerfs serves the tree flat and as a five-layer workspace.
//!
//! Run through `tools/nfs-load/run [--seconds S] [--rounds N] [--only NAME]
//! [--svg PATH] [--export-in DIR] [--soak S]`, which builds the `layerfs`
//! binary and the C ping-pong this needs. Exports go in /dev/shm unless
//! --export-in names another directory. `--only` takes name prefixes, comma
//! separated, matched against names written without their commas
//! (`readdirplus 1000 entries`); RENAME brings CREATE along, and REMOVE both. With `--soak S`, instead: a mixed
//! load on layerfs alone for S seconds, sampling the server's memory.

mod memfs;
mod peers;
mod report;
mod servers;
mod soak;
mod workloads;

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rpcbench::{run_load, LoadResult};
use servers::{Server, Usage};
use workloads::{Handles, Workload};

pub struct Row {
    pub workload: Workload,
    pub server: &'static str,
    pub depth: usize,
    pub load: LoadResult,
    /// What the server process spent over the run, warm-up included.
    pub usage: Usage,
    /// Calls the usage covers (the run's, warm-up included).
    pub calls_sent: u64,
}

struct Options {
    seconds: f64,
    rounds: usize,
    only: Option<String>,
    soak: Option<u64>,
    svg: String,
    export_in: PathBuf,
    layerfs: PathBuf,
    /// Another layerfs build, served flat beside the first, for
    /// before-and-after figures from the same rounds.
    base: Option<PathBuf>,
    pingpong: Option<PathBuf>,
}

fn options() -> Options {
    let exe = std::env::current_exe().expect("this program's path");
    // target/release/deps/nfs_load-HASH → target/release/layerfs
    let layerfs = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("layerfs"))
        .unwrap_or_default();
    let mut o = Options {
        seconds: 1.0,
        rounds: 3,
        only: None,
        soak: None,
        svg: concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/benchmarks.svg").to_string(),
        // The peers keep their data in memory; by default so do layerfs
        // and nfs-ganesha (a tmpfs), so the comparison is of servers.
        export_in: PathBuf::from(if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        }),
        layerfs,
        base: None,
        pingpong: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| args.next().unwrap_or_else(|| panic!("{arg} {what}"));
        match arg.as_str() {
            "--seconds" => o.seconds = value("S").parse().expect("--seconds S"),
            "--rounds" => o.rounds = value("N").parse().expect("--rounds N"),
            "--only" => o.only = Some(value("NAME")),
            "--soak" => o.soak = Some(value("S").parse().expect("--soak S")),
            "--svg" => o.svg = value("PATH"),
            "--export-in" => o.export_in = value("DIR").into(),
            "--layerfs" => o.layerfs = value("PATH").into(),
            "--pingpong" => o.pingpong = Some(value("PATH").into()),
            "--base" => o.base = Some(value("PATH").into()),
            "--huge" => peers::set_huge_files(value("N").parse().expect("--huge N")),
            "--serve" => {
                peers::serve_child(&value("KIND"));
                std::process::exit(0);
            }
            // cargo bench passes this to every bench binary.
            "--bench" => {}
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => {
                eprint!("nfs-load: unknown option {other}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    o
}

const USAGE: &str = "\
usage: tools/nfs-load/run [--keep-cpus-awake] [--seconds S] [--rounds N] [--only NAME[,NAME]]
                          [--svg PATH] [--export-in DIR] [--base PATH] [--soak S]
  --seconds S      length of each test in each round (default 1)
  --rounds N       rounds; servers and tests interleave, medians reported (default 3)
  --only NAMES     comma-separated name prefixes, e.g. \"GETATTR,readdirplus 1000\"
  --svg PATH       where the chart goes (default docs/benchmarks.svg)
  --export-in DIR  directory the exports are made in (default /dev/shm)
  --base PATH      another layerfs binary, served flat in the same rounds (\"layerfs base\"):
                   its CPU and system calls per call beside this build's
  --soak S         instead: a mixed load on layerfs alone for S seconds, sampling its memory
";

/// The generator's raw floor next to a minimal C ping-pong: the C client
/// and server alone, the C client against the floor process, and this
/// generator against the floor process, interleaved over three rounds
/// (medians). The generator must not be what sets the pace.
fn check_floor(o: &Options, floor: SocketAddr, duration: Duration) {
    let call = rpcbench::frame_call(0, 100_003, 3, 0, &nfs3_types::xdr_codec::Void).len();
    let reply = report::null_reply().len();
    let c_run = |pingpong: &Path, port: Option<u16>| -> Option<(f64, f64)> {
        let mut cmd = Command::new(pingpong);
        cmd.args([call, reply].map(|n| n.to_string()))
            .arg(duration.as_secs_f64().to_string());
        if let Some(port) = port {
            cmd.arg(port.to_string());
        }
        let out = cmd.output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut numbers = text.split_whitespace().filter_map(|n| n.parse().ok());
        Some((numbers.next()?, numbers.next()?))
    };
    let ours_run = || {
        let load = run_load(
            floor,
            1,
            2000,
            duration,
            5_000_000,
            |xid, _| rpcbench::frame_call(xid, 100_003, 3, 0, &nfs3_types::xdr_codec::Void),
            |_| false,
            |_, _| true,
        )
        .expect("floor run");
        (load.calls_per_sec(), load.p50_us)
    };
    let median = |mut runs: Vec<(f64, f64)>| {
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        runs.get(runs.len() / 2).copied()
    };
    let (mut c_alone, mut c_floor, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        if let Some(p) = &o.pingpong {
            c_alone.extend(c_run(p, None));
            c_floor.extend(c_run(p, Some(floor.port())));
        }
        ours.push(ours_run());
    }
    println!("raw floor, depth 1, {call}-byte calls and {reply}-byte replies (median of 3):");
    let ours = median(ours).expect("three runs");
    let line = |what: &str, (rate, p50): (f64, f64)| {
        println!("  {what:<44} {rate:>8.0} round trips/s, p50 {p50:.1} us");
    };
    line(
        "C ping-pong, client and server",
        median(c_alone).unwrap_or_default(),
    );
    match median(c_floor) {
        Some(c) => {
            line("C client -> the floor process", c);
            line("this load generator -> the floor process", ours);
            let ratio = ours.0 / c.0;
            println!(
                "  the generator reaches {ratio:.2}x the C client's rate on the same floor{}\n",
                if ratio >= 0.9 {
                    " (within 10%)"
                } else {
                    " (NOT within 10%: the figures below may measure the generator)"
                }
            );
        }
        None => {
            line("this load generator -> the floor process", ours);
            println!("  (no C ping-pong: --pingpong PATH; tools/nfs-load/run builds one)\n");
        }
    }
}

fn main() {
    let o = options();
    let duration = Duration::from_secs_f64(o.seconds);
    if !o.layerfs.is_file() {
        panic!(
            "no layerfs binary at {} (tools/nfs-load/run builds it; or --layerfs PATH)",
            o.layerfs.display()
        );
    }
    let chosen = |w: Workload| {
        // Names are matched without their thousands' commas, which
        // separate the prefixes: "readdirplus 1000 entries" is the 1,000-entry test.
        let name = w.name().to_lowercase().replace(',', "");
        o.only.as_deref().is_none_or(|only| {
            only.split(',')
                .any(|o| name.starts_with(&o.trim().to_lowercase()))
        })
    };
    // RENAME renames what CREATE made and REMOVE removes what RENAME named:
    // a later one chosen brings the earlier ones along.
    let chain = [Workload::Create, Workload::Rename, Workload::Remove];
    let needed = |w: Workload| match chain.iter().position(|&c| c == w) {
        Some(at) => chain[at..].iter().any(|&later| chosen(later)),
        None => chosen(w),
    };
    let workloads: Vec<Workload> = Workload::ALL.into_iter().filter(|&w| needed(w)).collect();
    if o.soak.is_none() && !workloads.contains(&Workload::ReaddirPlusHuge) {
        peers::set_huge_files(0);
    }
    eprintln!("preparing the data on every server ...");
    let data = tempfile::tempdir_in(&o.export_in).expect("temporary exports");
    let state = tempfile::tempdir().expect("temporary state");
    let flat = data.path().join("flat");
    let upper = data.path().join("upper");
    std::fs::create_dir(&flat).unwrap();
    peers::fill_dir(&flat);
    let layers = peers::fill_layers(&data.path().join("layers"));
    let start_flat = || {
        servers::layerfs("layerfs", &o.layerfs, &[flat.as_os_str()], state.path())
            .expect("start layerfs")
    };
    if let Some(seconds) = o.soak {
        let server = start_flat();
        let handles = Handles::of(server.nfs, server.mount, &server.path).expect("handles");
        println!("mixed load on layerfs for {seconds} s, resident memory of the server process:\n");
        soak::run(&server, std::sync::Arc::new(handles), seconds, 8);
        return;
    }
    let mut stack_args: Vec<&OsStr> = Vec::new();
    for l in &layers {
        stack_args.push(OsStr::new("--layer"));
        stack_args.push(l.as_os_str());
    }
    stack_args.push(OsStr::new("--upper"));
    stack_args.push(upper.as_os_str());
    let mut targets: Vec<Server> = vec![
        start_flat(),
        servers::layerfs("layerfs 5 layers", &o.layerfs, &stack_args, state.path())
            .expect("start layerfs on a stack"),
    ];
    if let Some(base) = &o.base {
        let base_dir = data.path().join("base");
        std::fs::create_dir(&base_dir).unwrap();
        peers::fill_dir(&base_dir);
        targets.push(
            servers::layerfs("layerfs base", base, &[base_dir.as_os_str()], state.path())
                .expect("start the base layerfs"),
        );
    }
    let ganesha_dir = data.path().join("ganesha");
    std::fs::create_dir(&ganesha_dir).unwrap();
    peers::fill_dir(&ganesha_dir);
    match servers::ganesha(&ganesha_dir, state.path()) {
        Ok(server) => targets.push(server),
        Err(e) => println!("nfs-ganesha is not measured: {e}\n"),
    }
    targets.push(servers::peer("nfs3_server").expect("start nfs3_server"));
    targets.push(servers::peer("nfsserve").expect("start nfsserve"));
    let (floor, floor_read) = servers::floors().expect("start the floor");
    let handles: Vec<Handles> = targets
        .iter()
        .map(|t| Handles::of(t.nfs, t.mount, &t.path).unwrap_or_else(|e| panic!("{}: {e}", t.name)))
        .collect();
    check_floor(&o, floor.nfs, duration);
    // WRITEs put back what the file holds, so READs always find it.
    let payload = peers::data();
    let mut runs = Vec::new();
    for round in 0..o.rounds {
        for &w in &workloads {
            for depth in w.depths() {
                eprintln!(
                    "round {}/{}: {} at depth {depth}",
                    round + 1,
                    o.rounds,
                    w.name()
                );
                for (t, h) in targets.iter().zip(&handles) {
                    if !h.serve(w) {
                        continue;
                    }
                    if round == 0 && depth == 1 {
                        if let Err(e) = w.check(t.nfs, h) {
                            eprintln!("  {}: {e} (its numbers below measure errors)", t.name);
                        }
                    }
                    let (warmup, max) = match w.fixed_calls() {
                        Some(n) => (0, n),
                        None => (if w.bytes().is_some() { 20 } else { 2000 }, 5_000_000),
                    };
                    // Names restart each round and depth; CREATE, RENAME and
                    // REMOVE of one round and depth share them.
                    let base = 100_000 * round as u32 + 50_000 * (depth > 1) as u32;
                    let counting = servers::SyscallCount::start(t);
                    let before = t.usage();
                    let load = run_load(
                        t.nfs,
                        depth,
                        warmup,
                        duration,
                        max,
                        |xid, seq| w.call(h, &payload, xid, seq, base),
                        |seq| w.is_probe(seq),
                        |seq, results| w.right(&payload, seq, results),
                    )
                    .unwrap_or_else(|e| panic!("{} {}: {e}", t.name, w.name()));
                    let mut usage = t.usage().since(before);
                    usage.syscalls = counting.and_then(servers::SyscallCount::stop);
                    if load.errors > 0 {
                        eprintln!(
                            "  {}: {} of its {} replies were errors (its numbers measure them)",
                            t.name,
                            load.errors,
                            w.name()
                        );
                    }
                    runs.push(Row {
                        workload: w,
                        server: t.name,
                        depth,
                        calls_sent: load.calls + u64::from(warmup),
                        load,
                        usage,
                    });
                }
                let floor_addr = match w {
                    Workload::Read => Some(floor_read),
                    Workload::Null => Some(floor.nfs),
                    _ => None,
                };
                if let Some(addr) = floor_addr {
                    let before = floor.usage();
                    let load = run_load(
                        addr,
                        depth,
                        20,
                        duration,
                        5_000_000,
                        |xid, seq| w.call(&handles[0], &payload, xid, seq, 0),
                        |_| false,
                        // The raw TCP floor answers with zeros, not the file.
                        |_, _| true,
                    )
                    .expect("floor run");
                    runs.push(Row {
                        workload: w,
                        server: floor.name,
                        depth,
                        calls_sent: load.calls + 20,
                        usage: floor.usage().since(before),
                        load,
                    });
                }
            }
        }
    }
    let rows = report::medians(&runs);
    println!(
        "{} round(s) of {} s per workload, server and depth (CREATE, RENAME and REMOVE: 2,000 calls); median round shown\n",
        o.rounds, o.seconds
    );
    report::print(&rows);
    if o.base.is_some() {
        report::print_versus_base(&runs);
    }
    if o.only.is_some() {
        return; // a partial run does not replace the chart
    }
    if let Err(e) = std::fs::write(&o.svg, report::svg(&rows)) {
        eprintln!("cannot write {}: {e}", o.svg);
    } else {
        eprintln!("chart written to {}", o.svg);
    }
}
