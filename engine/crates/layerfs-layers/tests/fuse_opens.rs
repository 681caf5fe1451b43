//! A file removed while open, through the FUSE door, against what Linux
//! does on a local directory: a process goes on reading, writing, syncing
//! and truncating a file it holds open after its last name is removed or
//! renamed over, and the name is free for a new file at once. Checked for a
//! plain directory and for a stack (the file in the upper and in a lower
//! layer), with the kernel's passthrough and without (every read and write
//! then reaches the door, as for a door not run as root, which this test
//! also runs as where fusermount3 lets it).
#![cfg(target_os = "linux")]

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use layerfs_fuse::{Caching, Options};
use layerfs_layers::StackFs;
use layerfs_vfs::{Filesystem, LocalFs};

/// What each step of the scenario saw, in words, for comparing two runs.
#[derive(Default)]
struct Seen(Vec<String>);

impl Seen {
    fn step<T: std::fmt::Debug>(&mut self, what: &str, result: std::io::Result<T>) {
        let outcome = match result {
            Ok(v) => format!("{v:?}"),
            Err(e) => format!("error {:?}", e.kind()),
        };
        self.0.push(format!("{what}: {outcome}"));
    }
}

fn contents(mut f: &File) -> std::io::Result<String> {
    let mut s = String::new();
    f.read_to_string(&mut s)?;
    Ok(s)
}

fn read_from_start(f: &File) -> std::io::Result<String> {
    let mut buf = vec![0; 64];
    let n = f.read_at(&mut buf, 0)?;
    buf.truncate(n);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Runs the scenario in `dir`, which holds `f` ("hello") and `g` ("old").
fn removed_while_open(dir: &Path) -> Vec<String> {
    let mut seen = Seen::default();
    let (f, g) = (dir.join("f"), dir.join("g"));
    // A reader first: in a stack it opens the lower file, which the
    // writer's open then copies up.
    let reader = File::open(&f).unwrap();
    let writer = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    seen.step("unlink", fs::remove_file(&f));
    seen.step("stat of the name", fs::metadata(&f).map(|m| m.len()));
    seen.step("write", writer.write_at(b"world", 5));
    seen.step("read by the reader", read_from_start(&reader));
    seen.step(
        "fstat: size, links",
        writer.metadata().map(|m| (m.len(), m.nlink())),
    );
    seen.step("fsync", writer.sync_all());
    seen.step("fdatasync", writer.sync_data());
    seen.step("ftruncate", writer.set_len(3));
    seen.step("read after ftruncate", read_from_start(&reader));
    seen.step("size after ftruncate", reader.metadata().map(|m| m.len()));
    seen.step(
        "fchmod",
        writer.set_permissions(Permissions::from_mode(0o640)),
    );
    seen.step("mode", reader.metadata().map(|m| m.mode() & 0o7777));
    // The name is free for a new file, which is another file.
    seen.step("a new file of the name", fs::write(&f, "new"));
    seen.step("read the old one", read_from_start(&writer));
    seen.step("read the new one", fs::read_to_string(&f));
    let again = format!("/proc/self/fd/{}", writer.as_raw_fd());
    seen.step(
        "open again through /proc",
        File::open(&again).and_then(|f| contents(&f)),
    );
    drop((reader, writer));
    seen.step("the new one after both closed", fs::read_to_string(&f));

    // Renamed over: the replaced file stays readable through its open.
    let old = File::open(&g).unwrap();
    fs::write(dir.join("h"), "replacement").unwrap();
    seen.step("rename over", fs::rename(dir.join("h"), &g));
    seen.step("read the replaced one", read_from_start(&old));
    seen.step("its links", old.metadata().map(|m| m.nlink()));
    seen.step("read the name", fs::read_to_string(&g));
    seen.0
}

fn fill(dir: &Path) {
    fs::write(dir.join("f"), "hello").unwrap();
    fs::write(dir.join("g"), "old").unwrap();
}

/// What Linux does on a local directory.
fn on_linux() -> Vec<String> {
    let t = tempfile::tempdir().unwrap();
    fill(t.path());
    let seen = removed_while_open(t.path());
    // The scenario says what it checks: were these not so, comparing
    // against it would prove little.
    for expected in [
        "stat of the name: error NotFound",
        "read by the reader: \"helloworld\"",
        "fstat: size, links: (10, 0)",
        "fsync: ()",
        "read after ftruncate: \"hel\"",
        "mode: 416",
        "read the old one: \"hel\"",
        "open again through /proc: \"hel\"",
        "read the replaced one: \"old\"",
    ] {
        assert!(
            seen.iter().any(|s| s == expected),
            "{expected} in {seen:#?}"
        );
    }
    seen
}

/// `fs` mounted at `at`, or `None` after saying why it cannot be.
fn mounted(
    fs: Arc<dyn Filesystem>,
    at: &Path,
    caching: Caching,
    passthrough: bool,
) -> Option<layerfs_fuse::Mounted> {
    let options = Options {
        caching,
        passthrough,
        ..Options::default()
    };
    // A user who is not root mounts through fusermount3, where it is.
    let mounted = layerfs_fuse::mount(fs, at, &options).map_err(|e| e.to_string());
    layerfs_testkit::or_skip(mounted, "a file removed while open, through FUSE")
}

fn compare(what: &str, through_door: Vec<String>, linux: &[String]) {
    for (door, local) in through_door.iter().zip(linux) {
        assert_eq!(door, local, "{what}: the door and Linux differ");
    }
    assert_eq!(through_door.len(), linux.len(), "{what}");
}

#[test]
fn a_file_removed_while_open_is_still_read_written_synced_and_truncated() {
    let linux = on_linux();
    for passthrough in [true, false] {
        let what = |fs: &str| format!("{fs}, passthrough asked for: {passthrough}");

        let t = tempfile::tempdir().unwrap();
        let (dir, at) = (t.path().join("dir"), t.path().join("mnt"));
        fs::create_dir(&dir).unwrap();
        fs::create_dir(&at).unwrap();
        fill(&dir);
        let flat = Arc::new(LocalFs::open(&dir).unwrap());
        let Some(m) = mounted(flat, &at, Caching::Shared, passthrough) else {
            return;
        };
        compare(&what("a directory"), removed_while_open(&at), &linux);
        m.unmount().unwrap();

        // In a stack: `f` and `g` in the lower layer, and in the upper.
        for in_upper in [false, true] {
            let t = tempfile::tempdir().unwrap();
            let d = |n: &str| t.path().join(n);
            for n in ["lower", "upper", "mnt"] {
                fs::create_dir(d(n)).unwrap();
            }
            fill(&d(if in_upper { "upper" } else { "lower" }));
            let stack = StackFs::open(&[d("lower")], &d("upper"), &d("state")).unwrap();
            let m = mounted(Arc::new(stack), &d("mnt"), Caching::Exclusive, passthrough).unwrap();
            let place = if in_upper { "upper" } else { "lower layer" };
            let seen = removed_while_open(&d("mnt"));
            compare(
                &what(&format!("a stack, the files in its {place}")),
                seen,
                &linux,
            );
            m.unmount().unwrap();
            // The new `f` is all the workspace shows, and a lower file is
            // hidden, not changed.
            assert_eq!(fs::read_to_string(d("upper").join("f")).unwrap(), "new");
            if !in_upper {
                assert_eq!(fs::read_to_string(d("lower").join("f")).unwrap(), "hello");
                assert_eq!(fs::read_to_string(d("lower").join("g")).unwrap(), "old");
            }
        }
    }
}
