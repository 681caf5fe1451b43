//! A layered workspace against the same tree flat: `stat` of every file and
//! a full `find` (READDIRPLUS walk), over NFS on loopback and through the
//! Filesystem trait in process; then a copy-up of a large file, timed, with
//! the growth of peak memory.
//!
//! cargo bench -p rpcbench --bench stack -- [--files N] [--layers N] [--rounds N] [--copy-up-mib N]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use layerfs_layers::StackFs;
use layerfs_rpc::{ServerConfig, ServerHandle};
use layerfs_vfs::{Caller, FileKind, Filesystem, LocalFs, Stability};
use nfs3_types::mount::{dirpath, mountres3};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Unpack};
use rpcbench::Client;

const DIRS: usize = 100;

struct Options {
    files: usize,
    layers: usize,
    rounds: usize,
    copy_up_mib: usize,
}

fn options() -> Options {
    let mut o = Options {
        files: 10_000,
        layers: 5,
        rounds: 5,
        copy_up_mib: 1024,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = || args.get(i + 1).and_then(|v| v.parse().ok());
        match args[i].as_str() {
            "--files" => o.files = value().expect("--files N"),
            "--layers" => o.layers = value().expect("--layers N"),
            "--rounds" => o.rounds = value().expect("--rounds N"),
            "--copy-up-mib" => o.copy_up_mib = value().expect("--copy-up-mib N"),
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    o
}

/// The tree: DIRS directories of files; in the layered form every directory
/// is in every layer, and file j of each lives in layer j % layers.
fn build(root: &Path, o: &Options) -> (PathBuf, Vec<PathBuf>) {
    let flat = root.join("flat");
    let layers: Vec<PathBuf> = (0..o.layers)
        .map(|l| root.join(format!("layer{l}")))
        .collect();
    for d in 0..DIRS {
        std::fs::create_dir_all(flat.join(format!("d{d}"))).unwrap();
        for l in &layers {
            std::fs::create_dir_all(l.join(format!("d{d}"))).unwrap();
        }
        for f in 0..o.files / DIRS {
            let rel = format!("d{d}/f{f}");
            let data = format!("file {rel}\n");
            std::fs::write(flat.join(&rel), &data).unwrap();
            std::fs::write(layers[f % o.layers].join(&rel), &data).unwrap();
        }
    }
    (flat, layers)
}

fn serve(fs: Arc<dyn Filesystem>, path: &Path) -> ServerHandle {
    let host_path = path.as_os_str().as_encoded_bytes();
    let addr = "127.0.0.1:0".parse().unwrap();
    layerfs_nfs::serve(fs, host_path, addr, ServerConfig::default()).unwrap()
}

fn unpack<T: Unpack>(bytes: &[u8]) -> T {
    let mut b = bytes;
    T::unpack(&mut b).unwrap().0
}

fn root_handle(c: &mut Client) -> nfs_fh3 {
    let res = c
        .call(100_005, 3, 1, &dirpath(Opaque::borrowed(b"/")))
        .unwrap();
    match unpack::<mountres3>(&res) {
        mountres3::Ok(ok) => nfs_fh3 {
            data: Opaque::owned(ok.fhandle.0.to_vec()),
        },
        mountres3::Err(s) => panic!("MNT: {s}"),
    }
}

fn nfs_lookup(c: &mut Client, dir: &nfs_fh3, name: &str) -> nfs_fh3 {
    let args = LOOKUP3args {
        what: diropargs3 {
            dir: dir.clone(),
            name: filename3(Opaque::borrowed(name.as_bytes())),
        },
    };
    match unpack::<LOOKUP3res>(&c.call(100_003, 3, 3, &args).unwrap()) {
        Nfs3Result::Ok(ok) => ok.object,
        Nfs3Result::Err((s, _)) => panic!("LOOKUP {name}: {s}"),
    }
}

/// `stat` of every file as a client without cached attributes does it:
/// LOOKUP of each name, then GETATTR.
fn nfs_stat_all(addr: SocketAddr, o: &Options) -> Duration {
    let mut c = Client::connect(addr).unwrap();
    let root = root_handle(&mut c);
    let start = Instant::now();
    for d in 0..DIRS {
        let dir = nfs_lookup(&mut c, &root, &format!("d{d}"));
        for f in 0..o.files / DIRS {
            let fh = nfs_lookup(&mut c, &dir, &format!("f{f}"));
            let res = c.call(100_003, 3, 1, &GETATTR3args { object: fh }).unwrap();
            assert!(matches!(unpack::<GETATTR3res>(&res), Nfs3Result::Ok(_)));
        }
    }
    start.elapsed()
}

/// `find` over NFS: READDIRPLUS of every directory, in 32 KiB pages.
fn nfs_find(addr: SocketAddr) -> (Duration, usize) {
    let mut c = Client::connect(addr).unwrap();
    let root = root_handle(&mut c);
    let start = Instant::now();
    let mut queue = vec![root];
    let mut seen = 0;
    while let Some(dir) = queue.pop() {
        let (mut cookie, mut verf) = (0, cookieverf3::default());
        loop {
            let args = READDIRPLUS3args {
                dir: dir.clone(),
                cookie,
                cookieverf: verf,
                dircount: 32 * 1024,
                maxcount: 32 * 1024,
            };
            let ok = match unpack::<READDIRPLUS3res>(&c.call(100_003, 3, 17, &args).unwrap()) {
                Nfs3Result::Ok(ok) => ok,
                Nfs3Result::Err((s, _)) => panic!("READDIRPLUS: {s}"),
            };
            verf = ok.cookieverf;
            for e in ok.reply.entries.0 {
                cookie = e.cookie;
                let name = e.name.as_ref();
                if name == b"." || name == b".." {
                    continue;
                }
                seen += 1;
                if let (post_op_attr::Some(a), post_op_fh3::Some(fh)) =
                    (&e.name_attributes, e.name_handle)
                {
                    if a.type_ == ftype3::NF3DIR {
                        queue.push(fh);
                    }
                }
            }
            if ok.reply.eof {
                break;
            }
        }
    }
    (start.elapsed(), seen)
}

fn direct_stat_all(fs: &dyn Filesystem, o: &Options) -> Duration {
    let who = Caller::root();
    let start = Instant::now();
    for d in 0..DIRS {
        let dir = fs
            .lookup(&who, fs.root(), format!("d{d}").as_bytes())
            .unwrap()
            .fileid;
        for f in 0..o.files / DIRS {
            let a = fs.lookup(&who, dir, format!("f{f}").as_bytes()).unwrap();
            fs.getattr(a.fileid).unwrap();
        }
    }
    start.elapsed()
}

fn direct_find(fs: &dyn Filesystem) -> Duration {
    let who = Caller::root();
    let start = Instant::now();
    let mut queue = vec![fs.root()];
    while let Some(dir) = queue.pop() {
        let mut cookie = 0;
        loop {
            let page = fs.readdir(&who, dir, cookie, 512, true).unwrap();
            for e in &page.entries {
                cookie = e.cookie;
                if e.cookie > 2 && e.attr.is_some_and(|a| a.kind == FileKind::Directory) {
                    queue.push(e.fileid);
                }
            }
            if page.eof {
                break;
            }
        }
    }
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The process's resident and peak resident memory, in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn copy_up(root: &Path, mib: usize) {
    let lower = root.join("big-layer");
    std::fs::create_dir_all(&lower).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(lower.join("big")).unwrap();
        let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
        for _ in 0..mib {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let fs = StackFs::open_in_upper(&[lower], &root.join("big-upper")).unwrap();
    let who = Caller::root();
    let id = fs.lookup(&who, fs.root(), b"big").unwrap().fileid;
    // Reset the peak to now, so it shows what the copy-up adds.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (rss, _) = memory();
    let start = Instant::now();
    fs.write(&who, id, 0, b"!", Stability::Unstable).unwrap();
    let took = start.elapsed();
    let (_, peak) = memory();
    assert_eq!(fs.getattr(id).unwrap().size, (mib as u64) << 20);
    println!(
        "copy-up of a {mib} MiB file: {:.0} ms ({:.0} MiB/s); peak memory growth {:.1} MiB",
        ms(took),
        mib as f64 / took.as_secs_f64(),
        peak.saturating_sub(rss) as f64 / (1 << 20) as f64,
    );
}

fn main() {
    let o = options();
    let tmp = tempfile::tempdir().unwrap();
    let (flat, layers) = build(tmp.path(), &o);
    println!(
        "{} files in {DIRS} directories; layered: {} layers, every directory in each",
        o.files, o.layers
    );
    let mut results: Vec<[Vec<Duration>; 2]> = (0..5).map(|_| [vec![], vec![]]).collect();
    for round in 0..o.rounds {
        // Fresh filesystems each round: nothing cached from the round before.
        let upper = tmp.path().join(format!("upper{round}"));
        let stacked: Arc<dyn Filesystem> =
            Arc::new(StackFs::open_in_upper(&layers, &upper).unwrap());
        let plain: Arc<dyn Filesystem> = Arc::new(LocalFs::open(&flat).unwrap());
        for (i, fs) in [plain, stacked].into_iter().enumerate() {
            let server = serve(fs.clone(), &flat);
            let addr = server.local_addr();
            results[0][i].push(nfs_stat_all(addr, &o));
            results[1][i].push(nfs_stat_all(addr, &o));
            let (took, seen) = nfs_find(addr);
            assert_eq!(seen, o.files + DIRS);
            results[2][i].push(took);
            results[3][i].push(direct_stat_all(&*fs, &o));
            results[4][i].push(direct_find(&*fs));
        }
    }
    println!(
        "\nmedian of {} rounds    flat ms   layered ms   layered/flat",
        o.rounds
    );
    let names = [
        "NFS stat, first",
        "NFS stat, again",
        "NFS find (READDIRPLUS)",
        "in-process stat",
        "in-process find",
    ];
    for (name, [flat, layered]) in names.iter().zip(results) {
        let (f, l) = (median(flat), median(layered));
        println!(
            "{name:<24} {:>8.1} {:>12.1} {:>13.2}x",
            ms(f),
            ms(l),
            ms(l) / ms(f)
        );
    }
    println!();
    copy_up(tmp.path(), o.copy_up_mib);
}
