//! The `layerfs serve` command as a user meets it.

use layerfs_testkit::null_reply_bytes_as;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_layerfs");

#[test]
fn serve_prints_its_address_first_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", dir.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let port: u16 = first
        .strip_prefix("listening on 127.0.0.1:")
        .and_then(|p| p.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("first line was {first:?}"));
    let mut rest = String::new();
    for _ in 0..4 {
        out.read_line(&mut rest).unwrap();
    }
    assert!(
        rest.contains(&format!("port={port},mountport={port}")),
        "mount commands: {rest}"
    );
    // It accepts connections on that port.
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    drop(stream);
    stops_cleanly_on_sigterm(&mut child);
}

#[test]
fn serve_of_a_missing_directory_fails_with_a_clear_error() {
    let out = Command::new(BIN)
        .args(["serve", "/no/such/dir"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot export /no/such/dir"), "stderr: {err}");
}

#[test]
fn help_explains_every_flag() {
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--window",
        "--workers",
        "--layer",
        "--upper",
        "--no-passthrough",
        "<DIR>",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn serve_of_a_stack_makes_the_upper_and_says_what_it_serves() {
    let t = tempfile::tempdir().unwrap();
    let (l1, l2, upper) = (
        t.path().join("l1"),
        t.path().join("l2"),
        t.path().join("up"),
    );
    std::fs::create_dir(&l1).unwrap();
    std::fs::create_dir(&l2).unwrap();
    let mut child = Command::new(BIN)
        .arg("serve")
        .args([
            "--layer".as_ref(),
            l1.as_os_str(),
            "--layer".as_ref(),
            l2.as_os_str(),
        ])
        .args(["--upper".as_ref(), upper.as_os_str()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut first, mut second) = (String::new(), String::new());
    out.read_line(&mut first).unwrap();
    out.read_line(&mut second).unwrap();
    assert!(first.starts_with("listening on 127.0.0.1:"), "{first}");
    assert!(second.contains("2 read-only layers"), "{second}");
    assert!(upper.is_dir(), "the upper was not made");
    stops_cleanly_on_sigterm(&mut child);
}

#[test]
fn a_layer_without_an_upper_and_a_dir_with_layers_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().to_str().unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--layer", dir])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--upper"));
    let out = Command::new(BIN)
        .args(["serve", dir, "--layer", dir, "--upper", dir])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = Command::new(BIN)
        .args(["serve", "--layer", "/no/such/layer", "--upper", dir])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/layer"));
}

/// Sends SIGTERM and checks that layerfs exits 0.
fn stops_cleanly_on_sigterm(child: &mut std::process::Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert_eq!(wait(child).code(), Some(0));
}

fn wait(child: &mut std::process::Child) -> std::process::ExitStatus {
    for _ in 0..100 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    panic!("layerfs did not stop within 5 s of SIGTERM");
}

/// Starts `layerfs serve DIR`, its log written to `log`, and returns it
/// with its port.
fn start_logging(dir: &std::path::Path, log: &std::path::Path) -> (std::process::Child, u16) {
    start_with_stderr(dir, std::fs::File::create(log).unwrap().into())
}

fn start_with_stderr(dir: &std::path::Path, stderr: Stdio) -> (std::process::Child, u16) {
    let mut child = Command::new(BIN)
        .args(["serve", dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let first = layerfs_testkit::first_line(&mut child);
    let port = first
        .trim_end()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("first line was {first:?}"));
    (child, port)
}

#[test]
fn another_local_user_is_refused_before_a_byte_is_read() {
    let root = rustix::process::geteuid().is_root();
    let setpriv = Command::new("setpriv").arg("--version").output().is_ok();
    if !root || !setpriv {
        layerfs_testkit::skip_or_fail(
            "serve: another local user's connection",
            "needs root and setpriv",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let (mut child, port) = start_logging(dir.path(), log.path());
    assert_eq!(
        null_reply_bytes_as(0, port),
        28,
        "root's NULL call is answered"
    );
    assert_eq!(null_reply_bytes_as(65534, port), 0, "uid 65534 got a reply");
    stops_cleanly_on_sigterm(&mut child);
    // Refused where an administrator looks: the log, at warn.
    let log = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("refused a connection from a local user")
            && l.contains("uid=65534")),
        "no warning of the refusal in the log:\n{log}"
    );
}

#[test]
fn serving_beyond_loopback_warns_at_every_start() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "0.0.0.0:0", "--allow-remote"])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log.path()).unwrap())
            .spawn()
            .unwrap();
        let first = layerfs_testkit::first_line(&mut child);
        assert!(first.starts_with("listening on"), "{first}");
        stops_cleanly_on_sigterm(&mut child);
        let log = std::fs::read_to_string(log.path()).unwrap();
        assert!(
            log.lines()
                .any(|l| l.contains("WARN") && l.contains("any host that can reach it")),
            "no warning at this start:\n{log}"
        );
    }
}

#[test]
fn a_listen_address_other_hosts_reach_needs_allow_remote() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-remote"), "stderr: {err}");
}
