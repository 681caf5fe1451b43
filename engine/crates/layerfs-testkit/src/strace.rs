//! Counting a process's system calls with `strace -c`, for the tests that
//! hold a path to a budget of them.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// System calls whose number follows timing rather than the work measured:
/// waits, wake-ups and yields, the allocator's (its heap grows now and then),
/// and those of a thread kept awake as it follows a client from CPU to CPU.
pub const NOT_COUNTED: [&str; 21] = [
    "futex",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "sched_yield",
    "nanosleep",
    "clock_nanosleep",
    "poll",
    "ppoll",
    "restart_syscall",
    "mmap",
    "munmap",
    "mprotect",
    "madvise",
    "mremap",
    "brk",
    "sched_getaffinity",
    "sched_setaffinity",
    "getsockopt",
    "getpid",
    "prctl",
];

/// How `strace` is told to print its table: [`counts`] reads this one.
pub const ARGS: [&str; 5] = ["-f", "-qq", "-c", "-U", "calls,errors,name"];

/// One system call's row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    pub name: String,
    pub calls: u64,
    pub errors: u64,
}

/// The rows of a table `strace` printed with [`ARGS`], but the total and the
/// calls in [`NOT_COUNTED`].
pub fn counts(table: &str) -> Vec<Count> {
    let mut rows = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // calls, then errors where there were any, then the name.
        let (calls, errors, name) = match fields[..] {
            [calls, errors, name] => (calls, errors, name),
            [calls, name] => (calls, "0", name),
            _ => continue,
        };
        let (Ok(calls), Ok(errors)) = (calls.parse(), errors.parse()) else {
            continue;
        };
        if name == "total" || NOT_COUNTED.contains(&name) {
            continue;
        }
        rows.push(Count {
            name: name.to_string(),
            calls,
            errors,
        });
    }
    rows
}

/// The rows (as [`counts`] reads them) of what process `pid` called, all
/// its threads, while `work` ran: `strace -c -f -p` attaches first, and
/// `work` starts only once every thread is traced.
pub fn calls_while(pid: u32, work: impl FnOnce()) -> Vec<Count> {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut tracer = Command::new("strace")
        .args(ARGS)
        .arg("-o")
        .arg(out.path())
        .arg("-p")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("strace runs");
    wait_traced(pid);
    work();
    let tracer_pid = rustix::process::Pid::from_child(&tracer);
    rustix::process::kill_process(tracer_pid, rustix::process::Signal::INT).unwrap();
    tracer.wait().unwrap();
    counts(&std::fs::read_to_string(out.path()).unwrap())
}

/// Waits until every thread of process `pid` has a tracer.
fn wait_traced(pid: u32) {
    let tasks = format!("/proc/{pid}/task");
    let traced = |task: std::io::Result<std::fs::DirEntry>| {
        let status = std::fs::read_to_string(task.unwrap().path().join("status"));
        status.is_ok_and(|s| {
            s.lines()
                .filter_map(|l| l.strip_prefix("TracerPid:"))
                .any(|tracer| tracer.trim() != "0")
        })
    };
    let start = Instant::now();
    while !std::fs::read_dir(&tasks).unwrap().all(traced) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "strace did not attach to process {pid}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Leaves out of `rows` one `fcntl` per `close` in a debug build, where std
/// checks each descriptor it closes with an `fcntl`: that call is the
/// build's, not the code's. Any other `fcntl` still counts.
pub fn leave_out_debug_close_checks(rows: &mut [Count]) {
    if !cfg!(debug_assertions) {
        return;
    }
    let closes = rows
        .iter()
        .find(|r| r.name == "close")
        .map_or(0, |r| r.calls);
    if let Some(fcntl) = rows.iter_mut().find(|r| r.name == "fcntl") {
        fcntl.calls = fcntl.calls.saturating_sub(closes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_read_without_its_total_and_timing_calls() {
        let table = "    calls    errors syscall
--------- --------- ------------------
        7           writev
       12         3 statx
        9           futex
--------- --------- ------------------
       28         3 total
";
        let row = |name: &str, calls, errors| Count {
            name: name.to_string(),
            calls,
            errors,
        };
        assert_eq!(counts(table), [row("writev", 7, 0), row("statx", 12, 3)]);
    }

    #[test]
    fn a_debug_build_leaves_out_one_fcntl_per_close_and_counts_the_rest() {
        let row = |name: &str, calls| Count {
            name: name.to_string(),
            calls,
            errors: 0,
        };
        let mut rows = [row("close", 3), row("fcntl", 5)];
        leave_out_debug_close_checks(&mut rows);
        let fcntls = if cfg!(debug_assertions) { 2 } else { 5 };
        assert_eq!(rows, [row("close", 3), row("fcntl", fcntls)]);
    }
}
