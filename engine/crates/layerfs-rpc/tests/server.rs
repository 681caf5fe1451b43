//! The server on real loopback sockets.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use layerfs_rpc::{
    Dispatcher, Program, Records, Server, ServerConfig, ServerHandle, TransportStats,
};
use support::{call_msg, framed, words, TestProgram, TEST_PROG};

fn start(program: TestProgram, window: usize) -> ServerHandle {
    let config = ServerConfig {
        window,
        workers: 4,
        ..ServerConfig::default()
    };
    start_with(program, config)
}

fn start_with(program: TestProgram, config: ServerConfig) -> ServerHandle {
    let programs: Vec<Box<dyn Program>> = vec![Box::new(program)];
    let dispatcher = Arc::new(Dispatcher::new(programs));
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), dispatcher, config);
    server.unwrap().spawn().unwrap()
}

fn connect(server: &ServerHandle) -> TcpStream {
    let stream = TcpStream::connect(server.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream
}

fn null_call(xid: u32) -> Vec<u8> {
    framed(&call_msg(xid, 2, TEST_PROG, 2, 0, (0, &[]), &[]))
}

/// Reads `n` replies and returns their xids in arrival order.
fn reply_xids(stream: &TcpStream, n: usize) -> Vec<u32> {
    let mut records = Records::new(stream);
    (0..n)
        .map(|_| {
            let record = records.next_record().unwrap().expect("a reply");
            u32::from_be_bytes(record.as_bytes()[..4].try_into().unwrap())
        })
        .collect()
}

/// Polls the server's counters until `done` holds (bounded wait).
fn wait_for_stats(server: &ServerHandle, done: impl Fn(&TransportStats) -> bool) -> TransportStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = server.stats();
        if done(&stats) || Instant::now() > deadline {
            return stats;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_thousand_pipelined_calls_all_get_their_replies() {
    let server = start(TestProgram::new(), 64);
    let stream = connect(&server);
    let mut sender = stream.try_clone().unwrap();
    let writer = thread::spawn(move || {
        let calls: Vec<u8> = (0..2000u32).flat_map(null_call).collect();
        sender.write_all(&calls).unwrap();
    });
    let mut xids = reply_xids(&stream, 2000);
    writer.join().unwrap();
    xids.sort_unstable();
    assert_eq!(xids, (0..2000).collect::<Vec<_>>());
    let stats = wait_for_stats(&server, |s| s.replies == 2000);
    assert_eq!((stats.records, stats.replies), (2000, 2000));
    assert!(
        stats.socket_reads < 2000,
        "pipelined calls share reads: {stats:?}"
    );
}

#[test]
fn at_depth_one_each_call_costs_one_read_and_each_reply_one_write() {
    let server = start(TestProgram::new(), 64);
    let mut stream = connect(&server);
    for xid in 0..100 {
        stream.write_all(&null_call(xid)).unwrap();
        assert_eq!(reply_xids(&stream, 1), vec![xid]);
    }
    let stats = wait_for_stats(&server, |s| s.replies == 100);
    assert_eq!(stats.replies, 100);
    assert_eq!(stats.socket_writes, 100);
    // The same counters for this connection alone.
    let conns = server.connections();
    assert_eq!(conns.len(), 1);
    assert_eq!(conns[0].0, stream.local_addr().unwrap());
    assert_eq!((conns[0].1.records, conns[0].1.replies), (100, 100));
    // One read per call; the read that will see the end of the stream is not made yet.
    assert!(stats.socket_reads <= 101, "{stats:?}");
}

#[test]
fn every_reject_case_gets_its_reply_over_the_socket() {
    let server = start(TestProgram::new(), 64);
    let mut stream = connect(&server);
    let accepted = [7, 1, 0, 0, 0];
    let cases: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (
            call_msg(7, 3, TEST_PROG, 2, 0, (0, &[]), &[]),
            words(&[7, 1, 1, 0, 2, 2]),
        ),
        (
            call_msg(7, 2, 100_227, 3, 0, (0, &[]), &[]),
            words(&[&accepted[..], &[1]].concat()),
        ),
        (
            call_msg(7, 2, TEST_PROG, 9, 0, (0, &[]), &[]),
            words(&[&accepted[..], &[2, 2, 3]].concat()),
        ),
        (
            call_msg(7, 2, TEST_PROG, 2, 9, (0, &[]), &[]),
            words(&[&accepted[..], &[3]].concat()),
        ),
        (
            call_msg(7, 2, TEST_PROG, 2, 1, (0, &[]), &[1]),
            words(&[&accepted[..], &[4]].concat()),
        ),
        (
            call_msg(7, 2, TEST_PROG, 2, 0, (6, &[]), &[]),
            words(&[7, 1, 1, 1, 1]),
        ),
    ];
    let mut records = Records::new(stream.try_clone().unwrap());
    for (call, want) in cases {
        stream.write_all(&framed(&call)).unwrap();
        assert_eq!(records.next_record().unwrap().unwrap().as_bytes(), want);
    }
}

#[test]
fn replies_and_short_records_are_dropped_without_closing_the_connection() {
    let server = start(TestProgram::new(), 64);
    let mut stream = connect(&server);
    let mut reply_msg = call_msg(5, 2, TEST_PROG, 2, 0, (0, &[]), &[]);
    reply_msg[4..8].copy_from_slice(&1u32.to_be_bytes());
    stream.write_all(&framed(&reply_msg)).unwrap();
    stream.write_all(&framed(&[1, 2, 3])).unwrap();
    stream.write_all(&null_call(6)).unwrap();
    assert_eq!(reply_xids(&stream, 1), vec![6]);
    assert_eq!(server.dispatcher().dropped(), 2);
}

/// Sends `hostile` on one connection; it must be closed while another
/// connection keeps being served.
fn assert_closes_only_its_connection(hostile: &[u8]) {
    let server = start(TestProgram::new(), 64);
    let mut good = connect(&server);
    let mut bad = connect(&server);
    // The server may close before taking all of it.
    let _ = bad.write_all(hostile);
    let mut buf = [0u8; 64];
    match bad.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("hostile connection not closed: {other:?}"),
    }
    good.write_all(&null_call(1)).unwrap();
    assert_eq!(reply_xids(&good, 1), vec![1]);
    let mut again = connect(&server);
    again.write_all(&null_call(2)).unwrap();
    assert_eq!(reply_xids(&again, 1), vec![2]);
}

#[test]
fn a_2_gib_mark_closes_only_that_connection() {
    let mut hostile = 0xFFFF_FFFFu32.to_be_bytes().to_vec();
    hostile.extend_from_slice(&[0; 100]);
    assert_closes_only_its_connection(&hostile);
}

#[test]
fn a_fragment_chain_past_2_mib_closes_only_that_connection() {
    let mut hostile = Vec::new();
    for _ in 0..3 {
        // Three non-last fragments of 1 MiB: the third passes the running limit.
        hostile.extend_from_slice(&(1024u32 * 1024).to_be_bytes());
        hostile.extend_from_slice(&vec![0; 1024 * 1024]);
    }
    assert_closes_only_its_connection(&hostile);
}

#[test]
fn a_full_window_stops_reading_until_a_call_finishes() {
    let (release, waiting) = mpsc::channel();
    let program = TestProgram::new();
    *program.release.lock().unwrap() = Some(waiting);
    let window = 4;
    let server = start(program, window);
    let mut stream = connect(&server);
    let calls: Vec<u8> = (0..20u32)
        .flat_map(|xid| framed(&call_msg(xid, 2, TEST_PROG, 2, 2, (0, &[]), &[])))
        .collect();
    stream.write_all(&calls).unwrap();
    // The window's calls are running and the reader holds one more, waiting.
    let stats = wait_for_stats(&server, |s| s.records as usize > window);
    assert_eq!(stats.records as usize, window + 1);
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        server.stats().records as usize,
        window + 1,
        "the reader kept reading"
    );
    for _ in 0..20 {
        release.send(()).unwrap();
    }
    let mut xids = reply_xids(&stream, 20);
    xids.sort_unstable();
    assert_eq!(xids, (0..20).collect::<Vec<_>>());
}

/// Sends WHERE calls `xids` in one write; which of them ran on a worker.
fn where_ran(stream: &mut TcpStream, xids: &[u32]) -> Vec<(u32, bool)> {
    let calls: Vec<u8> = xids
        .iter()
        .flat_map(|&xid| framed(&call_msg(xid, 2, TEST_PROG, 2, 4, (0, &[]), &[])))
        .collect();
    stream.write_all(&calls).unwrap();
    let mut records = Records::new(&*stream);
    let mut ran: Vec<(u32, bool)> = xids
        .iter()
        .map(|_| {
            let reply = records.next_record().unwrap().expect("a reply");
            let word =
                |at: usize| u32::from_be_bytes(reply.as_bytes()[at..at + 4].try_into().unwrap());
            (word(0), word(24) == 1)
        })
        .collect();
    ran.sort_unstable();
    ran
}

#[test]
fn a_brief_call_runs_on_the_reader_only_while_its_connection_is_idle() {
    let (release, waiting) = mpsc::channel();
    let program = TestProgram::new();
    *program.release.lock().unwrap() = Some(waiting);
    let server = start(program, 8);
    // Dropped before the server, so that a failed assertion ends the WAIT
    // the server's stop would otherwise wait for.
    let release = release;
    let mut stream = connect(&server);
    assert_eq!(where_ran(&mut stream, &[1]), [(1, false)], "alone");
    // Another record already read behind it: the first goes to a worker.
    assert!(where_ran(&mut stream, &[2, 3])[0].1, "one behind it");
    // A call in flight on a worker.
    stream
        .write_all(&framed(&call_msg(9, 2, TEST_PROG, 2, 2, (0, &[]), &[])))
        .unwrap();
    wait_for_stats(&server, |s| s.records == 4);
    assert_eq!(where_ran(&mut stream, &[4]), [(4, true)], "one in flight");
    release.send(()).unwrap();
    assert_eq!(reply_xids(&stream, 1), [9]);
    assert_eq!(where_ran(&mut stream, &[5]), [(5, false)], "idle again");
}

#[test]
fn work_left_until_after_the_reply_runs_once_it_has_left_on_reader_and_worker() {
    let (go, hold) = mpsc::channel();
    let program = TestProgram::new();
    *program.hold_after.lock().unwrap() = Some(hold);
    let called_back = program.called_back.clone();
    let server = start(program, 8);
    let go = go;
    let mut stream = connect(&server);
    // Without arguments LATER runs on the reader, with them on a worker.
    for (xid, args) in [(1, &[][..]), (2, &[0, 0, 0, 1][..])] {
        let call = call_msg(xid, 2, TEST_PROG, 2, 5, (0, &[]), args);
        stream.write_all(&framed(&call)).unwrap();
        // The work waits for `go`: the reply must come without it.
        assert_eq!(reply_xids(&stream, 1), [xid]);
        go.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !called_back.lock().unwrap().contains(&xid) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(2));
        }
    }
    assert_eq!(*called_back.lock().unwrap(), [1, 2], "each call back once");
}

#[test]
fn a_panicking_call_leaves_the_connection_and_its_window_working() {
    let server = start(TestProgram::new(), 2);
    let mut stream = connect(&server);
    // More panics than the window holds: each must give its slot back.
    for xid in 0..5 {
        stream
            .write_all(&framed(&call_msg(xid, 2, TEST_PROG, 2, 3, (0, &[]), &[])))
            .unwrap();
    }
    stream.write_all(&null_call(99)).unwrap();
    let mut xids = reply_xids(&stream, 6);
    xids.sort_unstable();
    assert_eq!(xids, vec![0, 1, 2, 3, 4, 99]);
}

#[test]
fn stop_closes_open_connections_and_ends_every_thread() {
    let programs: Vec<Box<dyn Program>> = vec![Box::new(TestProgram::new())];
    let dispatcher = Arc::new(Dispatcher::new(programs));
    let config = ServerConfig {
        window: 8,
        workers: 4,
        ..ServerConfig::default()
    };
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), dispatcher.clone(), config);
    let mut server = server.unwrap().spawn().unwrap();
    // One client idle, one in the middle of a record, one that just called.
    let idle = connect(&server);
    let mut partial = connect(&server);
    partial.write_all(&null_call(7)[..10]).unwrap();
    let mut active = connect(&server);
    active.write_all(&null_call(1)).unwrap();
    assert_eq!(reply_xids(&active, 1), vec![1]);
    wait_for_stats(&server, |s| s.connections == 3);
    assert_eq!(Arc::strong_count(&dispatcher), 2 + 4, "one per worker");

    let started = Instant::now();
    server.stop();
    assert!(started.elapsed() < Duration::from_secs(10));
    for mut client in [idle, partial, active] {
        let mut byte = [0u8; 1];
        assert_eq!(client.read(&mut byte).unwrap(), 0, "the server closed it");
    }
    assert_eq!(Arc::strong_count(&dispatcher), 2, "the workers are gone");
    assert_eq!(server.connections().len(), 0);
    server.stop(); // a second stop is a no-op
}

fn start_with_limits(record_deadline: Duration, idle_timeout: Duration) -> ServerHandle {
    let config = ServerConfig {
        record_deadline,
        idle_timeout,
        ..ServerConfig::default()
    };
    start_with(TestProgram::new(), config)
}

/// Reads until the server closes the stream; how long that took.
fn time_to_close(mut stream: &TcpStream) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return started.elapsed(),
            Ok(_) => continue,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

#[test]
fn a_record_stalled_half_way_closes_its_connection_at_the_deadline() {
    let server = start_with_limits(Duration::from_millis(300), Duration::from_secs(60));
    let mut stalled = connect(&server);
    stalled.write_all(&null_call(1)[..10]).unwrap();
    let waited = time_to_close(&stalled);
    assert!(
        waited >= Duration::from_millis(250),
        "closed early: {waited:?}"
    );
    // Others are served meanwhile and after.
    let mut other = connect(&server);
    other.write_all(&null_call(2)).unwrap();
    assert_eq!(reply_xids(&other, 1), vec![2]);
}

#[test]
fn a_record_trickled_a_byte_at_a_time_closes_its_connection_at_the_deadline() {
    let server = start_with_limits(Duration::from_millis(300), Duration::from_secs(60));
    let stream = connect(&server);
    let mut sender = stream.try_clone().unwrap();
    let call = null_call(1);
    let trickle = thread::spawn(move || {
        // 40 bytes at one per 50 ms: 2 s for a record due within 300 ms.
        for byte in call {
            if sender.write_all(&[byte]).is_err() {
                return true;
            }
            thread::sleep(Duration::from_millis(50));
        }
        false
    });
    let waited = time_to_close(&stream);
    assert!(
        waited < Duration::from_millis(300) + Duration::from_secs(2),
        "closed {waited:?} after the start, the deadline being 300 ms"
    );
    assert!(
        trickle.join().unwrap(),
        "the trickler sent its whole record: the server never cut it off"
    );
}

#[test]
fn an_idle_connection_is_closed_and_a_busy_one_is_not() {
    let server = start_with_limits(Duration::from_secs(30), Duration::from_millis(400));
    let idle = connect(&server);
    let mut active = connect(&server);
    for xid in 0..10 {
        active.write_all(&null_call(xid)).unwrap();
        assert_eq!(reply_xids(&active, 1), vec![xid]);
        thread::sleep(Duration::from_millis(100));
    }
    let waited = time_to_close(&idle);
    assert!(waited < Duration::from_secs(10));
    // The active one outlived the idle one's limit by far and still answers.
    active.write_all(&null_call(99)).unwrap();
    assert_eq!(reply_xids(&active, 1), vec![99]);
}

#[test]
fn past_the_connection_limit_the_longest_idle_connection_makes_room() {
    let (release, gate) = mpsc::channel();
    let program = TestProgram::new();
    *program.release.lock().unwrap() = Some(gate);
    let config = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let server = start_with(program, config);
    let mut idle = connect(&server);
    idle.write_all(&null_call(1)).unwrap();
    assert_eq!(reply_xids(&idle, 1), vec![1]);
    // A call that runs until released: this connection is busy.
    let mut busy = connect(&server);
    busy.write_all(&framed(&call_msg(2, 2, TEST_PROG, 2, 2, (0, &[]), &[])))
        .unwrap();
    wait_for_stats(&server, |s| s.records == 2);
    let mut third = connect(&server);
    time_to_close(&idle);
    third.write_all(&null_call(3)).unwrap();
    assert_eq!(reply_xids(&third, 1), vec![3], "the new one is served");
    release.send(()).unwrap();
    assert_eq!(reply_xids(&busy, 1), vec![2], "the busy one was kept");
}

#[test]
fn the_connection_that_called_last_is_not_the_one_closed_for_room() {
    // `first` opens and calls before `second`, then calls again after it:
    // `second` has been idle the longest, whatever either waited before
    // its last call.
    let config = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let server = start_with(TestProgram::new(), config);
    let mut first = connect(&server);
    first.write_all(&null_call(1)).unwrap();
    assert_eq!(reply_xids(&first, 1), vec![1]);
    thread::sleep(Duration::from_millis(150));
    let mut second = connect(&server);
    second.write_all(&null_call(2)).unwrap();
    assert_eq!(reply_xids(&second, 1), vec![2]);
    thread::sleep(Duration::from_millis(300));
    first.write_all(&null_call(3)).unwrap();
    assert_eq!(reply_xids(&first, 1), vec![3]);

    let mut third = connect(&server);
    time_to_close(&second);
    third.write_all(&null_call(4)).unwrap();
    assert_eq!(reply_xids(&third, 1), vec![4]);
    first.write_all(&null_call(5)).unwrap();
    assert_eq!(
        reply_xids(&first, 1),
        vec![5],
        "the one that called last stays"
    );
}
