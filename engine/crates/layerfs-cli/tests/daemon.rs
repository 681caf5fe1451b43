//! The workspace daemon and its commands as a user meets them: errors,
//! a second daemon, the control socket's defences. Mounting is exercised
//! end to end by tests/daemon/fuse.sh (FUSE) and the QEMU harness (NFS).

use layerfs_testkit::null_reply_bytes_as;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_layerfs");

/// A daemon on a store of its own, with its own runtime directory.
struct Daemon {
    child: Child,
    /// The line it printed when ready.
    ready: String,
    store: PathBuf,
    runtime: tempfile::TempDir,
    _base: tempfile::TempDir,
    socket: PathBuf,
}

impl Daemon {
    fn start() -> Daemon {
        let base = tempfile::tempdir().unwrap();
        let runtime = tempfile::tempdir().unwrap();
        let store = base.path().join("store");
        let (child, first) = spawn_daemon(&store, runtime.path());
        let socket = first
            .clone()
            .rsplit_once("control socket ")
            .map(|(_, s)| PathBuf::from(s.trim()))
            .unwrap_or_else(|| panic!("first line was {first:?}"));
        assert!(socket.starts_with(runtime.path()), "{socket:?}");
        Daemon {
            child,
            ready: first,
            store,
            runtime,
            _base: base,
            socket,
        }
    }

    /// The port of its NFS server, from its ready line.
    fn nfs_port(&self) -> u16 {
        nfs_port_of(&self.ready)
    }

    fn run(&self, args: &[&str]) -> Output {
        layerfs(&self.store, self.runtime.path(), args)
    }

    /// Runs a command that must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "layerfs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs a command that must fail with one line on stderr containing `what`.
    fn fails(&self, args: &[&str], what: &str) {
        let out = self.run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "layerfs {args:?} succeeded");
        assert!(err.contains(what), "layerfs {args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

/// Starts `layerfs daemon` and returns it with the first line it printed.
fn spawn_daemon(store: &Path, runtime: &Path) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(["daemon", "--store", store.to_str().unwrap()])
        .env("XDG_RUNTIME_DIR", runtime)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first = layerfs_testkit::first_line(&mut child);
    (child, first)
}

/// The NFS port a daemon's ready line names (`NFS on 127.0.0.1:PORT,`).
fn nfs_port_of(ready: &str) -> u16 {
    ready
        .split_once("NFS on 127.0.0.1:")
        .and_then(|(_, rest)| rest.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no NFS port in {ready:?}"))
}

fn layerfs(store: &Path, runtime: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("LAYERFS_STORE", store)
        .env("XDG_RUNTIME_DIR", runtime)
        .output()
        .unwrap()
}

#[test]
fn a_command_without_a_daemon_says_how_to_start_one() {
    let base = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    for args in [&["ls"][..], &["layer", "ls"], &["commit", "w"]] {
        let out = layerfs(&base.path().join("store"), runtime.path(), args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("no layerfs daemon is running") && err.contains("layerfs daemon"),
            "{err}"
        );
    }
}

#[test]
fn a_second_daemon_on_one_store_is_refused() {
    let d = Daemon::start();
    let out = Command::new(BIN)
        .args(["daemon", "--store", d.store.to_str().unwrap()])
        .env("XDG_RUNTIME_DIR", d.runtime.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("another layerfs daemon") && err.contains(&d.child.id().to_string()),
        "{err}"
    );
    // The first one still answers.
    d.ok(&["ls"]);
}

#[test]
fn mistakes_get_one_line_that_says_what_to_do() {
    let d = Daemon::start();
    let layer = tempfile::tempdir().unwrap();
    std::fs::write(layer.path().join("file"), b"x").unwrap();
    let id = d.ok(&["layer", "import", layer.path().to_str().unwrap()]);
    let id = id.trim();
    d.ok(&["create", "w", "--from", id]);
    let empty = tempfile::tempdir().unwrap();
    let full = tempfile::tempdir().unwrap();
    std::fs::write(full.path().join("x"), b"").unwrap();
    let empty_path = empty.path().to_str().unwrap();

    d.fails(&["create", "w"], "already exists");
    d.fails(&["create", "bad/name"], "a workspace name is");
    d.fails(&["create", "..", "--from", id], "a workspace name is");
    d.fails(
        &["create", "v", "--from", "0123456789"],
        "no layer 0123456789",
    );
    d.fails(&["mount", "nope", empty_path], "no workspace \"nope\"");
    d.fails(&["mount", "w", "/no/such/dir"], "does not exist");
    d.fails(&["mount", "w", full.path().to_str().unwrap()], "not empty");
    d.fails(&["unmount", "w"], "not mounted");
    d.fails(&["commit", "nope"], "no workspace");
    d.fails(&["rm", "nope"], "no workspace");
    d.fails(&["layer", "rm", id], "in use by workspace w");
    d.fails(&["layer", "rm", "abc"], "no layer abc");
    d.fails(&["layer", "import", "/no/such/layer"], "does not exist");

    // Nothing of the refused requests was kept.
    let ls = d.ok(&["ls"]);
    assert_eq!(ls.lines().count(), 2, "{ls}");
    d.ok(&["rm", "w"]);
    d.ok(&["layer", "rm", &id[..8]]);
    assert_eq!(d.ok(&["layer", "ls"]).lines().count(), 1);
}

#[test]
fn layers_come_from_directories_and_tarballs_and_commits() {
    let d = Daemon::start();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("etc")).unwrap();
    std::fs::write(src.path().join("etc/os-release"), b"ID=demo\n").unwrap();
    std::fs::write(src.path().join(".wh.gone"), b"").unwrap();
    let tarball = src.path().with_extension("tar.gz");
    let tar = Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(src.path())
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success());
    let from_dir = d.ok(&["layer", "import", src.path().to_str().unwrap()]);
    let from_tar = d.ok(&["layer", "import", tarball.to_str().unwrap()]);
    assert_eq!(from_dir, from_tar, "the same content, the same layer");
    let _ = std::fs::remove_file(&tarball);

    d.ok(&["create", "w", "--from", from_dir.trim()]);
    let committed = d.ok(&["commit", "w", "--message", "nothing yet"]);
    d.ok(&["create", "child", "--from", "w"]);

    let out = d.run(&["--json", "ls"]);
    assert!(out.status.success());
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let child = &reply
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "child")
        .unwrap()
        .clone();
    assert_eq!(child["parent"], "w");
    assert_eq!(
        child["layers"],
        serde_json::json!([from_dir.trim(), committed.trim()])
    );
    let layers = d.ok(&["layer", "ls"]);
    assert!(layers.contains("nothing yet"), "{layers}");
    d.fails(&["rm", "w"], "were made from w");
    // --json gives a refusal's kind to scripts.
    for (args, kind) in [
        (&["--json", "rm", "w"][..], "in_use"),
        (&["--json", "rm", "nothing-here"], "not_found"),
        (&["--json", "create", "child", "--from", "w"], "exists"),
        (&["--json", "create", ".bad", "--from", "w"], "invalid"),
    ] {
        let out = d.run(args);
        assert!(!out.status.success(), "{args:?}");
        let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(reply["error"]["kind"], kind, "{args:?}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(message),
            "{args:?}: the same message on stderr"
        );
    }
    d.ok(&["rm", "--force", "w"]);
}

#[test]
fn a_bad_or_oversized_control_message_gets_an_error_and_the_daemon_lives() {
    let d = Daemon::start();
    let ask = |bytes: &[u8]| -> String {
        let mut stream = UnixStream::connect(&d.socket).unwrap();
        let _ = stream.write_all(bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        reply
    };
    assert!(ask(b"not json\n").contains("bad request"));
    assert!(ask(b"{\"op\":\"explode\"}\n").contains("bad request"));
    assert!(ask(b"{\"op\":\"ls\"}").contains("cut short"));
    let mut huge = vec![b'{'; 3 * 1024 * 1024];
    huge.push(b'\n');
    assert!(ask(&huge).contains("longer than"));
    d.ok(&["ls"]);
}

#[test]
fn another_users_control_request_is_refused() {
    if !rustix::process::geteuid().is_root() {
        layerfs_testkit::skip_or_fail(
            "daemon: another user's control request",
            "switching to another uid needs root",
        );
        return;
    }
    let d = Daemon::start();
    // The socket's directory is 0700: another user cannot even reach it.
    let socket = d.socket.clone();
    let as_nobody = move |socket: PathBuf| {
        std::thread::spawn(move || {
            // This thread alone becomes uid 65534.
            rustix::thread::set_thread_res_uid(
                rustix::process::Uid::from_raw(65534),
                rustix::process::Uid::from_raw(65534),
                rustix::process::Uid::from_raw(65534),
            )
            .unwrap();
            let mut stream = UnixStream::connect(&socket)?;
            stream.write_all(b"{\"op\":\"ls\"}\n")?;
            let mut reply = String::new();
            stream.read_to_string(&mut reply)?;
            Ok::<_, std::io::Error>(reply)
        })
        .join()
        .unwrap()
    };
    let e = as_nobody(socket.clone()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    // Opened up, the peer's credentials still keep it out.
    let dir = socket.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let reply = as_nobody(socket.clone()).unwrap();
    assert!(reply.contains("uid 65534 may not control"), "{reply}");
    assert!(!reply.contains("\"ok\":true"), "{reply}");
    // The command itself will not use a socket directory others can open.
    d.fails(&["ls"], "with mode 0700");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    d.ok(&["ls"]);
}

#[test]
fn every_command_has_help() {
    for command in [
        "daemon", "layer", "create", "mount", "unmount", "commit", "ls", "rm", "stats",
    ] {
        let out = Command::new(BIN)
            .args([command, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{command} --help");
        assert!(String::from_utf8_lossy(&out.stdout).contains("--store"));
    }
}

#[test]
fn a_restart_sweeps_what_a_crash_left_half_made() {
    let base = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let store = base.path().join("store");
    let (mut child, _) = spawn_daemon(&store, runtime.path());
    let out = layerfs(&store, runtime.path(), &["create", "kept"]);
    assert!(out.status.success());
    child.kill().unwrap();
    child.wait().unwrap();
    // A workspace made but never recorded, and an import cut short.
    std::fs::create_dir_all(store.join("workspaces/half-made/tree/1")).unwrap();
    std::fs::create_dir_all(store.join("staging/123-0/etc")).unwrap();
    let (mut child, first) = spawn_daemon(&store, runtime.path());
    assert!(first.starts_with("layerfs daemon ready"), "{first}");
    assert!(!store.join("workspaces/half-made").exists());
    assert!(!store.join("staging/123-0").exists());
    assert!(store.join("workspaces/kept").is_dir());
    let ls = layerfs(&store, runtime.path(), &["ls"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("kept"));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_store_that_cannot_be_made_is_a_clear_error() {
    let base = tempfile::tempdir().unwrap();
    std::fs::write(base.path().join("file"), b"").unwrap();
    let out = Command::new(BIN)
        .args(["daemon", "--store"])
        .arg(base.path().join("file/store"))
        .env("XDG_RUNTIME_DIR", base.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot make the store"), "{err}");
}

#[test]
fn a_commit_cut_short_by_a_crash_is_recorded_at_the_next_start() {
    let base = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let store = base.path().join("store");
    let (mut child, _) = spawn_daemon(&store, runtime.path());
    let out = layerfs(&store, runtime.path(), &["create", "w"]);
    assert!(out.status.success());
    child.kill().unwrap();
    child.wait().unwrap();
    // What Workspace::commit leaves before the daemon records it: the old
    // upper is a layer of the stack, and a new, empty upper is on top.
    let ws = store.join("workspaces/w").canonicalize().unwrap();
    std::fs::write(ws.join("tree/1/made-before-the-crash"), b"kept").unwrap();
    std::fs::create_dir(ws.join("tree/2")).unwrap();
    std::fs::write(
        ws.join("stack"),
        format!(
            "{}\n{}\n",
            ws.join("tree/1").display(),
            ws.join("tree/2").display()
        ),
    )
    .unwrap();
    let (mut child, first) = spawn_daemon(&store, runtime.path());
    assert!(first.starts_with("layerfs daemon ready"), "{first}");
    let out = layerfs(&store, runtime.path(), &["--json", "ls"]);
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let layers = reply[0]["layers"].as_array().unwrap().clone();
    assert_eq!(layers.len(), 1, "{reply}");
    let id = layers[0].as_str().unwrap();
    let kept = store.join("layers").join(id).join("made-before-the-crash");
    assert_eq!(std::fs::read(kept).unwrap(), b"kept");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The one NFS server of a daemon admits root and the daemon's own user,
/// and refuses every other local user before reading a byte, with a
/// warning in the log; a daemon run by a user who is not root admits that
/// user.
#[test]
fn the_nfs_server_admits_root_and_the_daemons_user_only() {
    let root = rustix::process::geteuid().is_root();
    let setpriv = Command::new("setpriv").arg("--version").output().is_ok();
    if !root || !setpriv {
        layerfs_testkit::skip_or_fail(
            "daemon: who its NFS server admits",
            "needs root and setpriv to connect as other users",
        );
        return;
    }
    let mut d = Daemon::start();
    let port = d.nfs_port();
    assert_eq!(null_reply_bytes_as(0, port), 28, "root is admitted");
    assert_eq!(null_reply_bytes_as(65534, port), 0, "uid 65534 got a reply");
    let mut log = String::new();
    let mut stderr = d.child.stderr.take().unwrap();
    let pid = rustix::process::Pid::from_child(&d.child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    d.child.wait().unwrap();
    stderr.read_to_string(&mut log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("refused") && l.contains("uid=65534")),
        "no warning of the refusal:\n{log}"
    );

    // A daemon of uid 65534, on a store and runtime directory of its own.
    let base = tempfile::tempdir().unwrap();
    let runtime = base.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for dir in [base.path(), runtime.as_path()] {
        std::os::unix::fs::chown(dir, Some(65534), Some(65534)).unwrap();
    }
    let mut theirs = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BIN,
            "daemon",
            "--store",
        ])
        .arg(base.path().join("store"))
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("HOME", base.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = layerfs_testkit::first_line(&mut theirs);
    let port = nfs_port_of(&ready);
    assert_eq!(
        null_reply_bytes_as(65534, port),
        28,
        "its own user is admitted"
    );
    assert_eq!(null_reply_bytes_as(0, port), 28, "root is admitted");
    assert_eq!(null_reply_bytes_as(1000, port), 0, "uid 1000 got a reply");
    let pid = rustix::process::Pid::from_child(&theirs);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(theirs.wait().unwrap().success());
}

#[test]
fn system_df_counts_the_store_and_layer_prune_takes_only_what_nothing_uses() {
    let d = Daemon::start();
    let import = |bytes: usize| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("data"), vec![bytes as u8; bytes]).unwrap();
        d.ok(&["layer", "import", dir.path().to_str().unwrap()])
            .trim()
            .to_owned()
    };
    let (used, big, small) = (import(1 << 20), import(2 << 20), import(512 << 10));
    d.ok(&["create", "w", "--from", &used]);
    d.ok(&["create", "child", "--from", "w"]);
    let space: serde_json::Value =
        serde_json::from_str(&d.ok(&["--json", "system", "df"])).unwrap();
    let layers = &space["layers"];
    assert_eq!(layers["count"], 3, "{space}");
    assert_eq!(layers["reclaimable"], 2, "{space}");
    let reclaimable = layers["reclaimable_bytes"].as_u64().unwrap();
    assert!(
        ((2 << 20) + (512 << 10)..(3 << 20) + (512 << 10)).contains(&reclaimable),
        "{space}"
    );
    assert!(
        layers["bytes"].as_u64().unwrap() >= reclaimable + (1 << 20),
        "{space}"
    );
    assert_eq!(space["workspaces"]["count"], 2, "{space}");
    assert!(d.ok(&["system", "df"]).contains("layerfs layer prune"));

    let pruned: serde_json::Value =
        serde_json::from_str(&d.ok(&["--json", "layer", "prune"])).unwrap();
    let mut gone: Vec<&str> = pruned["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    gone.sort();
    let mut want = vec![big.as_str(), small.as_str()];
    want.sort();
    assert_eq!(gone, want, "{pruned}");
    assert_eq!(pruned["bytes"].as_u64(), Some(reclaimable));
    let held: Vec<String> = std::fs::read_dir(d.store.join("layers"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        held,
        std::slice::from_ref(&used),
        "the used layer alone is left"
    );
    assert_eq!(
        std::fs::read_dir(d.store.join("staging")).unwrap().count(),
        0
    );
    // Nothing more to take; the workspaces still stand on their layer.
    assert!(d.ok(&["layer", "prune"]).contains("0 layers removed"));
    d.ok(&["diff", "child"]);
    d.fails(&["layer", "rm", &used], "in use by workspaces");
}
