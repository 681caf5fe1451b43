//! Every host system call of the FUSE door is accounted for in four
//! everyday loops over a stack: new files copied in (as `cp -r` makes them),
//! removed again, a first append to each of many lower files (a copy-up
//! each), and many small writes to one file. Per file (per write in the
//! last), each loop must stay within its budget, so a change that adds a
//! call to one of these requests fails here.
//!
//! This binary runs itself as a child that mounts a stack through the door
//! and serves it; this process runs each loop on the mount while `strace -c
//! -f -p` counts the child's calls. Counted: every call of the door's
//! threads, reading each request from /dev/fuse and answering it included,
//! but those whose number follows timing
//! ([`layerfs_testkit::strace::NOT_COUNTED`]).
//!
//! Needs root (the budgets are for a door with passthrough), /dev/fuse and
//! strace; says SKIPPED without them, or fails with LAYERFS_REQUIRE_MOUNTS=1.

fn main() {
    #[cfg(target_os = "linux")]
    linux::main();
    #[cfg(not(target_os = "linux"))]
    layerfs_testkit::or_skip(
        Err::<(), _>("FUSE is Linux's".to_string()),
        "host calls per FUSE request",
    );
}

#[cfg(target_os = "linux")]
mod linux {
    use std::fs::{self, OpenOptions};
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::Arc;

    use layerfs_fuse::{Caching, Options};
    use layerfs_layers::StackFs;
    use layerfs_testkit::strace;

    const FILES: usize = 500;

    /// Host system calls per file, as measured when this test was written
    /// (its temporary directory on ext4, as root, passthrough, Linux 6.18);
    /// lower one when a change saves a call.
    ///
    /// - A new file: LOOKUP (`statx` of the directory and of the name, not
    ///   there), CREATE (`statx` of the directory, `openat`, `statx` of the new
    ///   file, the directory's `statx` after), the backing file registered
    ///   (`ioctl`), GETXATTR of `security.capability` answered without the
    ///   host, RELEASE (`ioctl` to drop the backing file), the directory's
    ///   GETATTR (`statx`), each request a `read` and a `writev`.
    /// - A removal: UNLINK (`statx` of the directory and of the name,
    ///   `unlinkat`, `close` of the file kept open, the directory's `statx`
    ///   after), the directory's GETATTR (`statx`), FORGET (read, not
    ///   answered).
    /// - A first append to a lower file: OPEN (the copy-up `tests/copy_up_budget.rs`
    ///   counts, its copy kept open and registered), GETXATTR
    ///   (`fgetxattr` on the open file), RELEASE.
    /// - A 4 KiB write to a file open for writing: nothing. The kernel writes
    ///   the host file itself, and asks for `security.capability` once per
    ///   file, not before each write (`FUSE_HANDLE_KILLPRIV_V2`); what is
    ///   counted is the file's creation, spread over the writes.
    const BUDGETS: [(Loop, f64); 4] = [
        (Loop::Create, 19.0),
        (Loop::Remove, 11.0),
        (Loop::Append, 27.0),
        (Loop::Writes, 0.1),
    ];

    #[derive(Clone, Copy, Debug)]
    enum Loop {
        Create,
        Remove,
        Append,
        Writes,
    }

    pub fn main() {
        if let Ok(dir) = std::env::var("LAYERFS_DOOR_CHILD") {
            serve(Path::new(&dir));
            return;
        }
        let why = if rustix::process::geteuid().as_raw() != 0 {
            Some("needs root: the budgets are for a door with passthrough")
        } else if !Path::new("/dev/fuse").exists() {
            Some("needs /dev/fuse")
        } else if Command::new("strace").arg("-V").output().is_err() {
            Some("strace is not installed (apt-get install strace)")
        } else {
            None
        };
        if let Some(why) = why {
            layerfs_testkit::or_skip(Err::<(), _>(why.to_string()), "host calls per FUSE request");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let lower = t.path().join("lower");
        fs::create_dir_all(lower.join("l")).unwrap();
        for i in 0..FILES {
            fs::write(lower.join(format!("l/f{i}")), b"a line\n").unwrap();
        }
        let mut door = Door::start(t.path());
        let mnt = door.mnt.clone();
        fs::create_dir(mnt.join("d")).unwrap();
        // The lower files named by a listing first, as a shell's glob does.
        assert_eq!(fs::read_dir(mnt.join("l")).unwrap().count(), FILES);
        let mut over = Vec::new();
        for (each, budget) in BUDGETS {
            let (per_file, which) = door.count(|| run(each, &mnt));
            println!("{each:?}: {per_file:.2} host calls per file (budget {budget})");
            println!("  {}", which.join(", "));
            // Each request is read and answered: fewer calls than that means
            // strace saw nothing, which must not pass as a budget met. (The
            // writes make one file.)
            let seen = match each {
                Loop::Writes => per_file * FILES as f64,
                _ => per_file,
            };
            assert!(
                seen >= 4.0,
                "{each:?}: only {per_file:.2} calls per file counted"
            );
            if !which.iter().any(|c| c.starts_with("ioctl ")) && matches!(each, Loop::Create) {
                door.stop();
                let why = "the kernel did not grant passthrough (Linux 6.9 or later offers it)";
                layerfs_testkit::or_skip(
                    Err::<(), _>(why.to_string()),
                    "host calls per FUSE request",
                );
                return;
            }
            if per_file > budget + 0.5 {
                over.push(format!("{each:?}: {per_file:.2} > {budget}"));
            }
        }
        door.stop();
        assert!(over.is_empty(), "over budget: {}", over.join("; "));
        println!("test result: ok");
    }

    /// One loop of [`FILES`] files (or writes) on the mount at `mnt`.
    fn run(each: Loop, mnt: &Path) {
        if let Loop::Writes = each {
            let mut f = fs::File::create_new(mnt.join("d/written")).unwrap();
            for _ in 0..FILES {
                f.write_all(&[b'w'; 4096]).unwrap();
            }
            drop(f);
            let size = fs::metadata(mnt.join("d/written")).unwrap().len();
            assert_eq!(size, 4096 * FILES as u64);
            return;
        }
        for i in 0..FILES {
            match each {
                // As cp makes a file it copies: O_CREAT|O_EXCL, one write.
                Loop::Create => {
                    let mut f = OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(mnt.join(format!("d/f{i}")))
                        .unwrap();
                    f.write_all(b"a new line\n").unwrap();
                }
                Loop::Remove => fs::remove_file(mnt.join(format!("d/f{i}"))).unwrap(),
                Loop::Append => {
                    let mut f = OpenOptions::new()
                        .append(true)
                        .open(mnt.join(format!("l/f{i}")))
                        .unwrap();
                    f.write_all(b"x\n").unwrap();
                }
                Loop::Writes => unreachable!("written above"),
            }
        }
        if let Loop::Append = each {
            let copied = fs::read_to_string(mnt.join("l/f0")).unwrap();
            assert_eq!(copied, "a line\nx\n", "the append shows");
        }
    }

    /// The child: serves the stack of `dir/lower` under `dir/upper` at
    /// `dir/mnt` until its stdin closes.
    fn serve(dir: &Path) {
        let mnt = dir.join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        let fs = StackFs::open_in_upper(&[dir.join("lower")], &dir.join("upper")).unwrap();
        // As a workspace is served: nothing changes its layers or upper
        // behind the door.
        let options = Options {
            caching: Caching::Exclusive,
            ..Options::default()
        };
        let mounted = layerfs_fuse::mount(Arc::new(fs), &mnt, &options).unwrap();
        println!("mounted");
        std::io::stdout().flush().unwrap();
        let mut rest = String::new();
        while std::io::stdin().read_line(&mut rest).unwrap_or(0) > 0 {}
        mounted.unmount().unwrap();
    }

    /// The child serving the mount.
    struct Door {
        child: Child,
        mnt: PathBuf,
    }

    impl Door {
        fn start(dir: &Path) -> Door {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .env("LAYERFS_DOOR_CHILD", dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let line = layerfs_testkit::first_line(&mut child);
            assert_eq!(line.trim(), "mounted", "the child did not mount");
            Door {
                child,
                mnt: dir.join("mnt"),
            }
        }

        /// Host calls per file of the door while `work` runs, and each call's
        /// count per file (those at least one in two files make).
        fn count(&mut self, work: impl FnOnce()) -> (f64, Vec<String>) {
            let mut rows = strace::calls_while(self.child.id(), work);
            strace::leave_out_debug_close_checks(&mut rows);
            let total: u64 = rows.iter().map(|r| r.calls).sum();
            let mut which: Vec<String> = rows
                .iter()
                .map(|r| (r.name.as_str(), r.calls as f64 / FILES as f64))
                .filter(|(_, per)| *per >= 0.5)
                .map(|(name, per)| format!("{name} {per:.2}"))
                .collect();
            which.sort();
            (total as f64 / FILES as f64, which)
        }

        /// Unmounts: the child does when its stdin closes.
        fn stop(&mut self) {
            drop(self.child.stdin.take());
            assert!(
                self.child.wait().unwrap().success(),
                "the child serving the mount failed"
            );
        }
    }

    /// A check that failed leaves no mount behind.
    impl Drop for Door {
        fn drop(&mut self) {
            if self.child.stdin.take().is_some() {
                let _ = self.child.wait();
            }
        }
    }
}
