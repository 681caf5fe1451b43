//! What layerfs' tests share: host filesystems mounted for one test's life
//! (a small tmpfs, an overlay), and the rule for a test that needs one and
//! cannot have it.
//!
//! The rule: where mounting is impossible (not root, no overlayfs), a test
//! says `SKIPPED` and checks nothing, unless `LAYERFS_REQUIRE_MOUNTS=1`
//! (verify.sh sets it when it runs as root), where the same failure fails
//! the test, so a broken mount never passes silently.
//!
//! Also what the system call budget tests share: [`strace`].

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod strace;

/// A filesystem mounted at a directory; unmounted when dropped.
#[derive(Debug)]
pub struct Mounted(PathBuf);

impl Mounted {
    /// A tmpfs of `size` (as mount(8) takes it: "256k", "1m") at `at`.
    pub fn tmpfs(at: &Path, size: &str) -> Result<Mounted, String> {
        mount(
            &["-t", "tmpfs", "-o", &format!("size={size}"), "layerfs-test"],
            at,
        )
    }

    /// An overlay of `lowers` (top first) under `upper` at `at`, with the
    /// extra mount options `extra` ("" for none).
    pub fn overlay(
        lowers_top_first: &[PathBuf],
        upper: &Path,
        work: &Path,
        at: &Path,
        extra: &str,
    ) -> Result<Mounted, String> {
        let lower: Vec<_> = lowers_top_first
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let mut opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            upper.display(),
            work.display()
        );
        if !extra.is_empty() {
            opts = format!("{opts},{extra}");
        }
        mount(&["-t", "overlay", "overlay", "-o", &opts], at)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount(args: &[&str], at: &Path) -> Result<Mounted, String> {
    if !rustix::process::geteuid().is_root() {
        return Err("mounting needs root".into());
    }
    let out = Command::new("mount")
        .args(args)
        .arg(at)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(Mounted(at.to_path_buf()))
}

/// `n` bytes from a xorshift sequence started at `seed`: data that
/// repeats nowhere (no two pieces of a file alike) and that a test can make
/// again to compare.
pub fn bytes_from(seed: u64, n: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The first line `child` printed on its stdout (piped; taken here): a
/// server a test started says there that it is ready, and where.
pub fn first_line(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("the child's stdout is piped"))
        .read_line(&mut line)
        .expect("the child's first line");
    line
}

/// Whether a test that cannot have what it needs must fail rather than skip.
pub fn mounts_required() -> bool {
    std::env::var("LAYERFS_REQUIRE_MOUNTS").is_ok_and(|v| v == "1")
}

/// `Some` of what was mounted, or, where mounting failed, `None` after
/// saying `SKIPPED` (or a panic where mounts are required).
pub fn or_skip<T>(mounted: Result<T, String>, test: &str) -> Option<T> {
    match mounted {
        Ok(m) => Some(m),
        Err(why) if mounts_required() => {
            panic!("{test}: LAYERFS_REQUIRE_MOUNTS=1 and a mount failed: {why}")
        }
        Err(why) => {
            skipped(test, &format!("{why}; nothing was checked"));
            None
        }
    }
}

/// Says that `test` cannot run here, and why: SKIPPED, or a panic where
/// LAYERFS_REQUIRE_MOUNTS=1 says everything a test needs is here (verify.sh
/// sets it as root).
pub fn skip_or_fail(test: &str, why: &str) {
    if mounts_required() {
        panic!("{test}: LAYERFS_REQUIRE_MOUNTS=1, and it cannot run here: {why}");
    }
    skipped(test, why);
}

/// Says that `test` checked nothing here, and why; where verify.sh
/// collects skips (`LAYERFS_SKIPS` names a file), adds the test's name to
/// the list its summary prints (tests/skip.sh does the same for scripts).
pub fn skipped(test: &str, why: &str) {
    eprintln!("SKIPPED: {test}: {why}");
    if let Some(list) = std::env::var_os("LAYERFS_SKIPS") {
        use std::io::Write;
        let line = format!("{test}\n");
        let appended = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&list)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = appended {
            eprintln!("cannot add {test} to {}: {e}", list.to_string_lossy());
        }
    }
}

/// Bytes of a NULL call to NFSv3 in one record, as `printf` escapes them.
fn null_call_escaped() -> String {
    let words: [u32; 10] = [0x8000_0028, 7, 0, 2, 100_003, 3, 0, 0, 0, 0];
    let mut record: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    // verifier: AUTH_NONE, empty
    record.extend_from_slice(&[0; 8]);
    record.iter().map(|b| format!("\\x{b:02x}")).collect()
}

/// How many reply bytes a NULL call to NFSv3 on 127.0.0.1:`port` gets when
/// a process running as `uid` (through `setpriv`, so root only) sends it
/// over a new connection: 28 when answered, 0 when the server refused the
/// connection.
pub fn null_reply_bytes_as(uid: u32, port: u16) -> usize {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && printf '{}' >&3 && timeout 5 head -c 28 <&3 | wc -c",
        null_call_escaped()
    );
    let out = Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={uid}"),
            "--clear-groups".into(),
            "bash".into(),
            "-c".into(),
            script,
        ])
        .output()
        .expect("setpriv runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Drops the kernel's cached directory entries and inodes (needs root), so
/// the next look at a file reaches its filesystem afresh.
pub fn drop_caches() -> Result<(), String> {
    std::fs::write("/proc/sys/vm/drop_caches", "2").map_err(|e| format!("drop_caches: {e}"))
}

/// A global allocator that remembers, per thread, the largest single
/// request and how many were made, so a test can show what one call
/// allocates while other tests run in parallel. Install it in a test binary
/// with `#[global_allocator] static A: LargestPerThread = LargestPerThread;`.
pub struct LargestPerThread;

thread_local! {
    static LARGEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn note_allocation(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    let _ = MADE.try_with(|n| n.set(n.get() + 1));
}

unsafe impl std::alloc::GlobalAlloc for LargestPerThread {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        note_allocation(layout.size());
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        note_allocation(new_size);
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

/// How many allocations (and reallocations) this thread made while running
/// `f` (with [`LargestPerThread`] installed; 0 without it).
pub fn allocations_while(f: impl FnOnce()) -> usize {
    let before = MADE.with(|n| n.get());
    f();
    MADE.with(|n| n.get()) - before
}

/// The largest allocation this thread made while running `f` (with
/// [`LargestPerThread`] installed; 0 without it).
pub fn largest_allocation_while(f: impl FnOnce()) -> usize {
    LARGEST.with(|l| l.set(0));
    f();
    LARGEST.with(|l| l.get())
}

/// An overlay whose lower is a directory on the disk holding the system's
/// temporary directory and whose upper is on a fresh tmpfs: layers on two
/// filesystems, without `xino`, as a container's or a VM's root often is.
/// There a directory's inode number changes whenever the kernel evicts its
/// cache entry ([`drop_caches`]).
pub struct CrossOverlay {
    // Unmounted in this order: the overlay, then the tmpfs under it.
    _overlay: Mounted,
    _tmpfs: Mounted,
    t: tempfile::TempDir,
}

impl CrossOverlay {
    /// Mounts it; `fill` makes the lower layer's content first.
    pub fn new(fill: impl FnOnce(&Path)) -> Result<CrossOverlay, String> {
        let t = tempfile::tempdir().map_err(|e| e.to_string())?;
        let dir = |n: &str| {
            let p = t.path().join(n);
            std::fs::create_dir_all(&p)
                .map(|()| p)
                .map_err(|e| e.to_string())
        };
        let lower = dir("lower")?;
        fill(&lower);
        let tmpfs = Mounted::tmpfs(&dir("m")?, "64m")?;
        let (upper, work) = (dir("m/up")?, dir("m/work")?);
        let overlay = Mounted::overlay(&[lower], &upper, &work, &dir("merged")?, "")?;
        Ok(CrossOverlay {
            _overlay: overlay,
            _tmpfs: tmpfs,
            t,
        })
    }

    /// Where the overlay is mounted.
    pub fn merged(&self) -> PathBuf {
        self.t.path().join("merged")
    }

    /// A directory beside the overlay, on the disk.
    pub fn beside(&self) -> &Path {
        self.t.path()
    }
}
