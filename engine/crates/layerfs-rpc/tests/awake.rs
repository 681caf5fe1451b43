//! The thread that keeps a CPU awake between a client's calls: started by
//! the first reply that leaves a connection whose client waits for it, at the
//! lowest priority, asleep once calls stop, and absent when the server is told
//! not to keep one or the calls are large.
//! A test binary of its own: the thread is one per process.

#![cfg(target_os = "linux")]

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use layerfs_rpc::{Dispatcher, Program, Records, Server, ServerConfig};
use support::{call_msg, framed, TestProgram, TEST_PROG};

/// Serves one NULL call at depth 1 with `stay_awake`.
fn one_call(stay_awake: Duration) {
    one_call_of(stay_awake, NULL, &[]);
}

/// NULL runs on the connection's reader, WAIT (not told to wait) on a worker.
const NULL: u32 = 0;
const WAIT: u32 = 2;

/// Serves one call of `proc` with `args` at depth 1 with `stay_awake`.
fn one_call_of(stay_awake: Duration, proc: u32, args: &[u8]) {
    let config = ServerConfig {
        stay_awake,
        ..ServerConfig::default()
    };
    let programs: Vec<Box<dyn Program>> = vec![Box::new(TestProgram::new())];
    let dispatcher = Arc::new(Dispatcher::new(programs));
    let bound = Server::bind("127.0.0.1:0".parse().unwrap(), dispatcher, config);
    let server = bound.unwrap().spawn().unwrap();
    let mut stream = TcpStream::connect(server.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
        .write_all(&framed(&call_msg(1, 2, TEST_PROG, 2, proc, (0, &[]), args)))
        .unwrap();
    let mut records = Records::new(&stream);
    assert!(records.next_record().unwrap().is_some(), "a reply");
}

/// What /proc says of one thread.
struct Task {
    state: char,
    nice: i32,
    /// User and system time, in clock ticks.
    ticks: u64,
}

/// This process's threads named `name`.
fn threads_named(name: &str) -> Vec<Task> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // The fields after the name in parentheses, from the third (state).
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let number = |i: usize| f[i].parse::<i64>().unwrap();
        found.push(Task {
            state: f[0].chars().next().unwrap(),
            nice: number(16) as i32,
            ticks: (number(11) + number(12)) as u64,
        });
    }
    found
}

/// The spinning thread. The server starts it just after a reply leaves,
/// so the client may hold the reply before the thread exists: it is looked
/// for until it appears, for 10 s at most.
fn awake_thread() -> Task {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut found = threads_named("rpc-awake");
        if !found.is_empty() || Instant::now() >= deadline {
            assert_eq!(found.len(), 1, "one for the process, however many servers");
            return found.pop().unwrap();
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// No spinning thread, once the server has had time to start one after
/// its last reply.
fn no_awake_thread() -> bool {
    thread::sleep(Duration::from_millis(200));
    threads_named("rpc-awake").is_empty()
}

#[test]
fn one_thread_at_nice_19_spins_after_a_reply_and_sleeps_once_calls_stop() {
    if thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        layerfs_testkit::skip_or_fail(
            "awake: one thread spins",
            "one CPU, where no thread is kept spinning",
        );
        return;
    }
    one_call(Duration::ZERO);
    assert!(no_awake_thread(), "none without a window");

    // A call this large takes longer to arrive than a halted CPU to wake.
    let large = vec![0; 256 * 1024];
    one_call_of(Duration::from_micros(200), NULL, &large);
    one_call_of(Duration::from_micros(200), WAIT, &large);
    assert!(
        no_awake_thread(),
        "none after a large call, on the reader or a worker"
    );

    one_call(Duration::from_micros(200));
    // The thread lowers its own priority as it starts, which may be just
    // after the reply. Once calls have stopped, within moments it sleeps.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let task = awake_thread();
        if task.nice == 19 && task.state == 'S' {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "10 s after the last reply: nice {} (it takes only time nothing \
             else wants at 19), state {} (asleep is S)",
            task.nice,
            task.state
        );
        thread::sleep(Duration::from_millis(10));
    }
    // It costs nothing asleep.
    let before = awake_thread().ticks;
    thread::sleep(Duration::from_millis(500));
    assert_eq!(awake_thread().ticks, before, "no CPU time while asleep");

    // A second server uses the same thread.
    one_call(Duration::from_micros(200));
    awake_thread();
}
