//! A process serving a stack killed (SIGKILL) at arbitrary points of copy-ups,
//! removals, renames and creates, and inside a burst of 1,000 copy-ups whose
//! records wait in the inode map's log: the next start accepts what it left,
//! every acknowledged change is there, ids are kept and the layer is
//! untouched.
//!
//! Its own harness: the test runs itself as the child that is killed.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use layerfs_layers::StackFs;
use layerfs_vfs::{Caller, Create, Error, FileId, Filesystem, SetAttr, Stability};

const FILES: usize = 40;
/// A lower file large enough that a kill lands inside its copy-up.
const BIG: usize = 96 << 20;

fn who() -> Caller {
    Caller::root()
}

fn layer(dir: &Path) {
    let l = dir.join("lower");
    std::fs::create_dir_all(l.join("sub")).unwrap();
    for i in 0..FILES {
        std::fs::write(l.join(format!("f{i}")), format!("lower {i}\n").repeat(2000)).unwrap();
        std::fs::write(l.join(format!("sub/g{i}")), b"deep").unwrap();
    }
}

fn big_layer(dir: &Path) {
    let l = dir.join("lower");
    std::fs::create_dir_all(&l).unwrap();
    std::fs::write(l.join("big"), vec![b'L'; BIG]).unwrap();
}

/// Copies `big` up by a durable write until killed.
fn big_child(dir: &Path) {
    let fs = open(dir);
    let big = id(&fs, "big").unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "start").unwrap();
    out.flush().unwrap();
    fs.write(&who(), big, 0, b"UPPER", Stability::FileSync)
        .unwrap();
    writeln!(out, "ack big").unwrap();
    out.flush().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(60));
}

/// Kills a copy-up of `big` after `delay`: the file shows whole, from the
/// layer or from the upper, and acknowledged means from the upper.
fn big_round(me: &Path, delay: std::time::Duration) -> bool {
    let t = tempfile::tempdir().unwrap();
    big_layer(t.path());
    let before = id(&open(t.path()), "big").unwrap();
    let mut child = Command::new(me)
        .env("LAYERFS_CRASH_CHILD", t.path())
        .env("LAYERFS_CRASH_BIG", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "start");
    std::thread::sleep(delay);
    child.kill().unwrap();
    child.wait().unwrap();
    let acked = lines
        .next()
        .is_some_and(|l| l.is_ok_and(|l| l == "ack big"));
    let fs = open(t.path());
    let big = id(&fs, "big").unwrap();
    assert_eq!(big, before, "the copied-up file changed id");
    let mut data = Vec::new();
    fs.read(&who(), big, 0, BIG, &mut data).unwrap();
    assert_eq!(data.len(), BIG, "half a copy shows");
    let upper = data.starts_with(b"UPPER");
    assert!(upper || !acked, "an acknowledged write is lost");
    assert!(data[5..].iter().all(|&b| b == b'L'), "data mixed up");
    let layer = std::fs::read(t.path().join("lower/big")).unwrap();
    assert!(layer.iter().all(|&b| b == b'L'), "the layer changed");
    upper
}

/// Files in the burst of copy-ups.
const BURST: usize = 1000;

fn burst_layer(dir: &Path) {
    let l = dir.join("lower");
    std::fs::create_dir_all(&l).unwrap();
    for i in 0..BURST {
        std::fs::write(l.join(format!("b{i}")), format!("lower {i}\n")).unwrap();
    }
}

/// Copies up every file of the burst by an unstable write, each tenth then
/// fsynced, printing each once acknowledged, until killed.
fn burst_child(dir: &Path) {
    let fs = open(dir);
    let mut out = std::io::stdout().lock();
    for i in 0..BURST {
        let f = id(&fs, &format!("b{i}")).unwrap();
        let data = format!("upper {i}\n");
        fs.write(&who(), f, 0, data.as_bytes(), Stability::Unstable)
            .unwrap();
        if i % 10 == 0 {
            fs.commit(f).unwrap();
        }
        writeln!(out, "ack {i}").unwrap();
        out.flush().unwrap();
    }
    std::thread::sleep(std::time::Duration::from_secs(60));
}

/// Kills the burst after `kill_after` acknowledged copy-ups: each of them
/// shows its write under its lower id, the rest show whole.
fn burst_round(me: &Path, kill_after: usize) {
    let t = tempfile::tempdir().unwrap();
    burst_layer(t.path());
    let lower_ids: Vec<FileId> = {
        let fs = open(t.path());
        (0..BURST)
            .map(|i| id(&fs, &format!("b{i}")).unwrap())
            .collect()
    };
    let mut child = Command::new(me)
        .env("LAYERFS_CRASH_CHILD", t.path())
        .env("LAYERFS_CRASH_BURST", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..kill_after {
        lines.next().expect("the child stopped early").unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let fs = open(t.path());
    for (i, &lower_id) in lower_ids.iter().enumerate() {
        let name = format!("b{i}");
        let f = id(&fs, &name).unwrap();
        let mut data = Vec::new();
        fs.read(&who(), f, 0, 1 << 10, &mut data).unwrap();
        let upper = data == format!("upper {i}\n").as_bytes();
        assert!(
            upper || data == format!("lower {i}\n").as_bytes(),
            "{name}: {data:?} is neither whole copy nor the layer's"
        );
        if i < kill_after {
            assert!(upper, "{name}: an acknowledged write is lost");
        }
        // Acknowledged or not, a copy-up that shows keeps the lower id.
        assert_eq!(f, lower_id, "{name} changed id (its copy shows: {upper})");
    }
}

fn open(dir: &Path) -> StackFs {
    StackFs::open_in_upper(&[dir.join("lower")], &dir.join("upper")).unwrap()
}

fn id(fs: &StackFs, name: &str) -> Result<FileId, Error> {
    Ok(fs.lookup(&who(), fs.root(), name.as_bytes())?.fileid)
}

/// Changes the stack until killed, printing each change once it is acknowledged.
fn child(dir: &Path) {
    let fs = open(dir);
    let root = fs.root();
    let mut out = std::io::stdout().lock();
    for i in 0..FILES {
        match i % 4 {
            // A copy-up by a durable write.
            0 => {
                let f = id(&fs, &format!("f{i}")).unwrap();
                fs.write(
                    &who(),
                    f,
                    0,
                    format!("upper {i}").as_bytes(),
                    Stability::FileSync,
                )
                .unwrap();
            }
            1 => fs
                .remove(&who(), root, format!("f{i}").as_bytes())
                .map(drop)
                .unwrap(),
            2 => fs
                .rename(
                    &who(),
                    root,
                    format!("f{i}").as_bytes(),
                    root,
                    format!("r{i}").as_bytes(),
                )
                .map(drop)
                .unwrap(),
            _ => {
                let how = Create::Guarded(SetAttr::default());
                let (a, _) = fs
                    .create(&who(), root, format!("n{i}").as_bytes(), how)
                    .unwrap();
                fs.write(&who(), a.fileid, 0, b"new", Stability::FileSync)
                    .unwrap();
                fs.commit(a.fileid).unwrap();
            }
        }
        writeln!(out, "ack {i}").unwrap();
        out.flush().unwrap();
    }
    // The whole lower directory `sub` renamed: a tree copy-up.
    fs.rename(&who(), root, b"sub", root, b"moved").unwrap();
    writeln!(out, "ack moved").unwrap();
    out.flush().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(60));
}

fn check(dir: &Path, acked: &[String], lower_ids: &[(String, FileId)]) {
    let fs = open(dir);
    let ids: std::collections::HashMap<_, _> = lower_ids.iter().cloned().collect();
    let done = |i: usize| acked.iter().any(|a| *a == format!("ack {i}"));
    let read = |f: FileId| {
        let mut v = Vec::new();
        fs.read(&who(), f, 0, 1 << 20, &mut v).unwrap();
        v
    };
    for i in 0..FILES {
        let name = format!("f{i}");
        match i % 4 {
            0 => {
                let f = id(&fs, &name).unwrap();
                assert_eq!(f, ids[&name], "{name} changed id");
                let data = read(f);
                let upper = data.starts_with(format!("upper {i}").as_bytes());
                assert!(upper || !done(i), "{name}: an acknowledged write is lost");
                let rest = format!("lower {i}\n").repeat(2000);
                let tail = &data[format!("upper {i}").len().min(data.len())..];
                assert!(rest.as_bytes().ends_with(tail), "{name}: data mixed up");
                assert_eq!(data.len(), rest.len(), "{name}: half a copy shows");
            }
            1 if done(i) => assert_eq!(id(&fs, &name), Err(Error::NoEnt)),
            2 if done(i) => {
                assert_eq!(id(&fs, &name), Err(Error::NoEnt));
                assert_eq!(id(&fs, &format!("r{i}")).unwrap(), ids[&name]);
            }
            3 if done(i) => assert_eq!(read(id(&fs, &format!("n{i}")).unwrap()), b"new"),
            // Not acknowledged: either before or after, both whole.
            2 => assert!(id(&fs, &name).is_ok() != id(&fs, &format!("r{i}")).is_ok()),
            _ => {}
        }
    }
    let moved = acked.iter().any(|a| a == "ack moved");
    let sub = id(&fs, if moved { "moved" } else { "sub" }).unwrap();
    assert_eq!(sub, ids["sub"], "the renamed directory changed id");
    let page = fs.readdir(&who(), sub, 0, 1000, true).unwrap();
    assert_eq!(
        page.entries.len(),
        FILES + 2,
        "a directory's copy shows half"
    );
    assert!(page.entries.iter().all(|e| e.attr.is_some()));
    for i in 0..FILES {
        let lower = dir.join(format!("lower/f{i}"));
        assert_eq!(
            std::fs::read(lower).unwrap(),
            format!("lower {i}\n").repeat(2000).as_bytes()
        );
    }
}

fn main() {
    if let Ok(dir) = std::env::var("LAYERFS_CRASH_CHILD") {
        if std::env::var_os("LAYERFS_CRASH_BIG").is_some() {
            big_child(Path::new(&dir));
        } else if std::env::var_os("LAYERFS_CRASH_BURST").is_some() {
            burst_child(Path::new(&dir));
        } else {
            child(Path::new(&dir));
        }
        return;
    }
    let me = std::env::current_exe().unwrap();
    let rounds = 12;
    for round in 0..rounds {
        let t = tempfile::tempdir().unwrap();
        layer(t.path());
        let lower_ids: Vec<(String, FileId)> = {
            let fs = open(t.path());
            let mut v: Vec<_> = (0..FILES).map(|i| format!("f{i}")).collect();
            v.push("sub".into());
            v.into_iter()
                .map(|n| (n.clone(), id(&fs, &n).unwrap()))
                .collect()
        };
        let mut child = Command::new(&me)
            .env("LAYERFS_CRASH_CHILD", t.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Killed after a different number of acknowledged changes each round.
        let kill_after = round * (FILES + 1) / (rounds - 1);
        let mut acked = Vec::new();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        while acked.len() < kill_after {
            match lines.next() {
                Some(line) => acked.push(line.unwrap()),
                None => break,
            }
        }
        assert_eq!(
            acked.len(),
            kill_after,
            "the child stopped before acknowledging what it was to"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        check(t.path(), &acked, &lower_ids);
        println!(
            "round {round}: killed after {} acknowledged changes: consistent",
            acked.len()
        );
    }
    // Kills inside a 96 MiB copy-up, at moments spread over its length.
    let mut copied = 0;
    let big_rounds = 6;
    for round in 0..big_rounds {
        // 0.5 ms to 512 ms: from early in the copy to after its end.
        let delay = std::time::Duration::from_micros(500 << (2 * round));
        copied += usize::from(big_round(&me, delay));
        println!("copy-up killed after {delay:?}: consistent");
    }
    // A kill that never lands inside a copy-up proves nothing about one.
    assert!(
        copied < big_rounds as usize,
        "all {big_rounds} copy-ups finished before their kill: none was cut"
    );
    // Kills inside a burst of copy-ups, early, in the middle and late.
    for kill_after in [7, 480, 993] {
        burst_round(&me, kill_after);
        println!("burst of {BURST} copy-ups killed after {kill_after}: consistent");
    }
    println!("test result: ok. {rounds} crash rounds, {big_rounds} inside copy-ups ({copied} had finished), 3 inside bursts");
}
