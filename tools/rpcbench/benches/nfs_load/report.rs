//! Tables, ratios and the chart.

use std::fmt::Write;

use crate::workloads::Workload;
use crate::Row;

/// The framed NULL reply: mark, xid, REPLY, MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS.
pub fn null_reply() -> Vec<u8> {
    reply_of(0)
}

/// A framed accepted reply carrying `payload` bytes after its header.
pub fn reply_of(payload: usize) -> Vec<u8> {
    let mut frame = (0x8000_0000u32 | (24 + payload) as u32)
        .to_be_bytes()
        .to_vec();
    for w in [0u32, 1, 0, 0, 0, 0] {
        frame.extend_from_slice(&w.to_be_bytes());
    }
    frame.resize(frame.len() + payload, 0);
    frame
}

/// Each (workload, server, depth)'s median round by calls/s.
pub fn medians(runs: &[Row]) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for r in runs {
        if out
            .iter()
            .any(|o| o.workload == r.workload && o.server == r.server && o.depth == r.depth)
        {
            continue;
        }
        let mut same: Vec<&Row> = runs
            .iter()
            .filter(|o| o.workload == r.workload && o.server == r.server && o.depth == r.depth)
            .collect();
        same.sort_by(|a, b| a.load.calls_per_sec().total_cmp(&b.load.calls_per_sec()));
        let m = same[same.len() / 2];
        // A row some round of which failed calls is left out of the ratios.
        let mut load = m.load.clone();
        load.errors = same.iter().map(|o| o.load.errors).sum();
        out.push(Row {
            workload: m.workload,
            server: m.server,
            depth: m.depth,
            load,
            usage: m.usage,
            calls_sent: m.calls_sent,
        });
    }
    out
}

/// The row of `server` for `w` at `depth`, if all its calls succeeded:
/// a row with errors measures the errors, and enters no ratio.
fn find<'a>(rows: &'a [Row], w: Workload, server: &str, depth: usize) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.workload == w && r.server == server && r.depth == depth)
        .filter(|r| r.load.errors == 0)
}

/// One figure of a row, where the row has it.
type Figure<'a> = dyn Fn(&Row) -> Option<f64> + 'a;

/// This build over the base build (`--base`), flat, per workload and
/// depth: the median over rounds of each figure, taken separately (a
/// round's CPU per call and its rate move apart on a shared machine).
pub fn print_versus_base(runs: &[Row]) {
    println!("### this build over the base build (flat; medians of rounds)\n");
    println!("| workload | depth | calls/s | CPU us/call | syscalls/call |");
    println!("|---|---:|---:|---:|---:|");
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    for w in Workload::ALL {
        for depth in w.depths() {
            let of = |server: &str, figure: &Figure<'_>| {
                median(
                    runs.iter()
                        .filter(|r| r.workload == w && r.server == server && r.depth == depth)
                        .filter_map(figure)
                        .collect(),
                )
            };
            let per_call = |r: &Row, n: f64| n / r.calls_sent.max(1) as f64;
            let figures: [&Figure<'_>; 3] = [
                &|r| Some(r.load.calls_per_sec()),
                &|r| Some(per_call(r, r.usage.cpu().as_secs_f64() * 1e6)),
                &|r| r.usage.syscalls.map(|n| per_call(r, n as f64)),
            ];
            let cells: Vec<String> = figures
                .iter()
                .map(|f| match (of("layerfs", f), of("layerfs base", f)) {
                    (Some(ours), Some(base)) => {
                        format!("{ours:.2} / {base:.2} = {:.2}x", ours / base)
                    }
                    _ => "-".into(),
                })
                .collect();
            if cells[0] != "-" {
                println!("| {} | {depth} | {} |", w.name(), cells.join(" | "));
            }
        }
    }
    println!();
}

/// The servers layerfs is measured against.
const PEERS: [&str; 3] = ["nfs-ganesha", "nfs3_server", "nfsserve"];
/// layerfs as it runs here: a directory alone, and a five-layer workspace.
const OURS: [&str; 2] = ["layerfs", "layerfs 5 layers"];

/// `ours`' rate over the best peer's, and that peer's name.
fn versus_best_peer(
    rows: &[Row],
    w: Workload,
    ours: &str,
    depth: usize,
) -> Option<(f64, &'static str)> {
    let ours = find(rows, w, ours, depth)?.load.calls_per_sec();
    let (name, best) = PEERS
        .iter()
        .filter_map(|p| find(rows, w, p, depth).map(|r| (*p, r.load.calls_per_sec())))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    Some((ours / best, name))
}

/// The p50 and p99 shown: of the probes where a workload has them.
fn latencies(r: &Row) -> (f64, f64) {
    r.load.probes_us.unwrap_or((r.load.p50_us, r.load.p99_us))
}

fn mb_per_sec(r: &Row) -> Option<f64> {
    r.workload
        .bytes()
        .map(|b| r.load.calls_per_sec() * b as f64 / 1e6)
}

pub fn print(rows: &[Row]) {
    for w in Workload::ALL {
        if !rows.iter().any(|r| r.workload == w) {
            continue;
        }
        println!("### {}\n", w.name());
        println!(
            "| server | depth | calls/s | MB/s | p50 us | p99 us | CPU us/call | syscalls/call | errors |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in rows.iter().filter(|r| r.workload == w) {
            let per_call = |n: f64| n / r.calls_sent.max(1) as f64;
            let mbs = mb_per_sec(r).map_or("-".into(), |m| format!("{m:.0}"));
            let (p50, p99) = latencies(r);
            println!(
                "| {} | {} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {} | {} |",
                r.server,
                r.depth,
                r.load.calls_per_sec(),
                mbs,
                p50,
                p99,
                per_call(r.usage.cpu().as_secs_f64() * 1e6),
                r.usage
                    .syscalls
                    .map_or("-".into(), |n| format!("{:.2}", per_call(n as f64))),
                r.load.errors,
            );
        }
        println!();
        for depth in w.depths() {
            for ours in OURS {
                let failed = rows.iter().find(|r| {
                    r.workload == w && r.server == ours && r.depth == depth && r.load.errors > 0
                });
                if let Some(r) = failed {
                    println!(
                        "depth {depth}: {ours} had {} errors: left out of the ratios",
                        r.load.errors
                    );
                    continue;
                }
                let Some((ratio, peer)) = versus_best_peer(rows, w, ours, depth) else {
                    continue;
                };
                print!("depth {depth}: {ours} = {ratio:.2}x the best peer ({peer})");
                let ours_row = find(rows, w, ours, depth).expect("found above");
                if let Some(floor) = find(rows, w, "tcp floor", depth) {
                    if w.bytes().is_some() {
                        print!(
                            "; {:.0}% of the raw TCP floor's MB/s",
                            100.0 * ours_row.load.calls_per_sec() / floor.load.calls_per_sec()
                        );
                    } else {
                        print!(
                            "; p50 = {:.2}x the raw TCP floor's",
                            ours_row.load.p50_us / floor.load.p50_us
                        );
                    }
                }
                if let Some(g) = find(rows, w, "nfs-ganesha", depth) {
                    let (ours, theirs) = (latencies(ours_row), latencies(g));
                    print!("; p50 = {:.2}x nfs-ganesha's", ours.0 / theirs.0);
                    if ours_row.load.probes_us.is_some() {
                        print!(", p99 = {:.2}x", ours.1 / theirs.1);
                    }
                }
                println!();
            }
        }
        println!();
    }
}

/// A bar per workload and depth: layerfs' rate over the best peer's, with the
/// 1.5x target marked.
pub fn svg(rows: &[Row]) -> String {
    let mut bars = Vec::new();
    for w in Workload::ALL {
        for depth in w.depths() {
            for ours in OURS {
                if let Some((ratio, peer)) = versus_best_peer(rows, w, ours, depth) {
                    let what = if ours == "layerfs" { "" } else { " (5 layers)" };
                    bars.push((format!("{}{what} @{depth}", w.name()), ratio, peer));
                }
            }
        }
    }
    let (left, bar_h, gap, width) = (400.0, 18.0, 8.0, 960.0);
    let max = bars.iter().map(|b| b.1).fold(2.0f64, f64::max).ceil();
    let scale = (width - left - 60.0) / max;
    let height = 60.0 + bars.len() as f64 * (bar_h + gap);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"##
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="20" font-size="14" font-weight="bold">layerfs calls/s over the best peer's (same run, one connection)</text>"##
    );
    for (i, (label, ratio, peer)) in bars.iter().enumerate() {
        let y = 40.0 + i as f64 * (bar_h + gap);
        let color = if *ratio >= 1.5 {
            "#2e7d32"
        } else if *ratio >= 1.0 {
            "#f9a825"
        } else {
            "#c62828"
        };
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{label}</text>"##,
            left - 8.0,
            y + 13.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{y}" width="{:.1}" height="{bar_h}" fill="{color}"/>"##,
            ratio * scale
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{}">{ratio:.2}x vs {peer}</text>"##,
            left + ratio * scale + 6.0,
            y + 13.0
        );
    }
    for (mark, dash) in [(1.0, "2,2"), (1.5, "6,3")] {
        let x = left + mark * scale;
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="30" x2="{x:.1}" y2="{:.1}" stroke="#333" stroke-dasharray="{dash}"/>"##,
            height - 10.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{mark}x</text>"##,
            height - 0.0
        );
    }
    s.push_str("</svg>\n");
    s
}
