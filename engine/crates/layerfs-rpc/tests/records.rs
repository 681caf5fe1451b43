//! The record reader against the contract: framing, costs in `read` calls,
//! limits, truncation and signal interruption, through a scripted stream.

mod support;

use std::io::ErrorKind;

use layerfs_rpc::{Record, Records, READ_AHEAD, RECORD_LIMIT};
use support::{body, fragments, framed, Script, Step};

/// Reads every record until a clean end, as owned bodies.
fn read_all(script: Script) -> (Vec<Vec<u8>>, usize) {
    let mut records = Records::new(script);
    let mut out = Vec::new();
    while let Some(record) = records.next_record().expect("a well-formed stream") {
        out.push(record.into_vec());
    }
    (out, records.get_ref().reads)
}

fn read_error(script: Script) -> ErrorKind {
    let mut records = Records::new(script);
    loop {
        match records.next_record() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream ended cleanly"),
            Err(e) => return e.kind(),
        }
    }
}

#[test]
fn a_whole_call_costs_one_read() {
    let call = body(120, 1);
    let mut records = Records::new(Script::whole(framed(&call)));
    let record = records.next_record().unwrap().unwrap();
    assert!(matches!(record, Record::Buffered(_)));
    assert_eq!(record.as_bytes(), call);
    assert_eq!(records.get_ref().reads, 1);
    assert_eq!(records.reads(), 1);
}

#[test]
fn two_records_in_one_segment_cost_one_read() {
    let (a, b) = (body(100, 1), body(200, 2));
    let mut stream = framed(&a);
    stream.extend(framed(&b));
    let mut records = Records::new(Script::whole(stream));
    assert_eq!(records.next_record().unwrap().unwrap().as_bytes(), a);
    assert_eq!(records.next_record().unwrap().unwrap().as_bytes(), b);
    assert_eq!(records.get_ref().reads, 1);
}

#[test]
fn each_record_says_how_many_bytes_already_read_follow_it() {
    let (a, b, big) = (body(100, 1), body(200, 2), body(READ_AHEAD * 2, 3));
    let mut stream = framed(&a);
    stream.extend(framed(&b));
    stream.extend(&framed(&big)[..10]);
    let second = framed(&b).len() + 10;
    let mut records = Records::new(Script::new([
        Step::Data(stream),
        Step::Data(framed(&big)[10..].to_vec()),
    ]));
    let (record, rest) = records.next_record_and_rest().unwrap().unwrap();
    assert_eq!((record.as_bytes(), rest), (&a[..], second));
    let (record, rest) = records.next_record_and_rest().unwrap().unwrap();
    assert_eq!(
        (record.as_bytes(), rest),
        (&b[..], 10),
        "the next one's start"
    );
    let (record, rest) = records.next_record_and_rest().unwrap().unwrap();
    assert!(matches!(record, Record::Owned(_)));
    assert_eq!((record.as_bytes(), rest), (&big[..], 0));
    assert!(records.next_record_and_rest().unwrap().is_none());
}

#[test]
fn a_body_of_8188_bytes_fills_the_read_ahead_in_one_read() {
    let call = body(READ_AHEAD - 4, 3);
    assert_eq!(call.len(), 8188);
    let mut records = Records::new(Script::whole(framed(&call)));
    let record = records.next_record().unwrap().unwrap();
    assert!(matches!(record, Record::Buffered(_)));
    assert_eq!(record.as_bytes(), call);
    assert_eq!(records.get_ref().reads, 1);
}

#[test]
fn a_body_one_past_the_read_ahead_gets_its_own_buffer() {
    let call = body(READ_AHEAD - 3, 4);
    let mut records = Records::new(Script::whole(framed(&call)));
    let record = records.next_record().unwrap().unwrap();
    assert!(matches!(record, Record::Owned(_)));
    assert_eq!(record.as_bytes(), call);
    assert_eq!(records.get_ref().reads, 2);
}

#[test]
fn a_large_body_costs_the_buffered_prefix_and_one_exact_read() {
    let write = body(1024 * 1024, 5);
    let mut records = Records::new(Script::whole(framed(&write)));
    let record = records.next_record().unwrap().unwrap();
    assert!(matches!(record, Record::Owned(_)));
    assert_eq!(record.as_bytes(), write);
    assert_eq!(records.get_ref().reads, 2);
    assert_eq!(
        records.buffered(),
        0,
        "the read-ahead is empty after a large record"
    );
}

#[test]
fn the_8188_byte_boundary_after_a_small_record() {
    let small = body(100, 6);
    let full = body(READ_AHEAD - 4, 7);
    let mut stream = framed(&small);
    stream.extend(framed(&full));
    stream.extend(framed(&small));
    let (got, reads) = read_all(Script::whole(stream));
    assert!(got == vec![small.clone(), full, small]);
    // The read-ahead holds 8192 bytes at a time: the small record and most of
    // the full one; the full one's tail with the next mark; the last body; EOF.
    assert_eq!(reads, 4);
}

#[test]
fn bytes_after_a_large_record_stay_buffered_for_the_next() {
    let large = body(20_000, 8);
    let small = body(40, 9);
    let mut stream = framed(&large);
    stream.extend(framed(&small));
    // The large record's tail and the small record arrive in one segment.
    let split = 8192 + 100;
    let script = Script::new([
        Step::Data(stream[..split].to_vec()),
        Step::Data(stream[split..].to_vec()),
    ]);
    let (got, _) = read_all(script);
    assert!(got == vec![large, small]);
}

#[test]
fn marks_split_across_reads_in_every_piece_size() {
    let records = [
        body(0, 0),
        body(1, 1),
        body(3, 2),
        body(4, 3),
        body(5000, 4),
        body(9000, 5),
    ];
    let mut stream = Vec::new();
    for r in &records {
        stream.extend(framed(r));
    }
    for size in [1, 2, 3, 4, 5, 7, 8, 13, 4096, 8191, 8192, 8193] {
        let (got, _) = read_all(Script::pieces(&stream, size));
        assert!(got == records, "pieces of {size} bytes: records differ");
    }
}

#[test]
fn zero_length_fragments_are_legal() {
    let (got, _) = read_all(Script::whole(fragments(&[b"", b"ab", b"", b"cd", b""])));
    assert_eq!(got, vec![b"abcd".to_vec()]);
    let (got, _) = read_all(Script::whole(framed(b"")));
    assert_eq!(got, vec![Vec::<u8>::new()]);
}

#[test]
fn a_fragment_chain_within_the_read_ahead() {
    let (a, b, c) = (body(10, 1), body(20, 2), body(30, 3));
    let (got, reads) = read_all(Script::whole(fragments(&[&a, &b, &c])));
    assert_eq!(got, vec![[a, b, c].concat()]);
    assert_eq!(
        reads, 2,
        "one read for the chain, one for the end of stream"
    );
}

#[test]
fn a_fragment_chain_past_the_read_ahead() {
    let parts = [body(5000, 1), body(7000, 2), body(100_000, 3), body(3, 4)];
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let mut stream = fragments(&refs);
    stream.extend(framed(b"next"));
    for size in [1, 1000, 8192, usize::MAX] {
        let (got, _) = read_all(Script::pieces(&stream, size.min(stream.len())));
        assert!(
            got == vec![parts.concat(), b"next".to_vec()],
            "pieces of {size}: records differ"
        );
    }
}

#[test]
fn a_fragment_past_the_limit_is_refused() {
    let mark = (0x8000_0000u32 | (RECORD_LIMIT as u32 + 1)).to_be_bytes();
    assert_eq!(
        read_error(Script::whole(mark.to_vec())),
        ErrorKind::InvalidData
    );
    let mark = 0xFFFF_FFFFu32.to_be_bytes();
    assert_eq!(
        read_error(Script::whole(mark.to_vec())),
        ErrorKind::InvalidData
    );
}

#[test]
fn a_fragment_of_exactly_the_limit_is_accepted() {
    let write = body(RECORD_LIMIT, 1);
    let (got, _) = read_all(Script::whole(framed(&write)));
    assert!(got == vec![write]);
}

#[test]
fn a_chain_whose_total_passes_the_limit_is_refused() {
    let half = body(RECORD_LIMIT / 2, 1);
    let mut stream = fragments(&[&half, &half]);
    // Turn the accepted chain into one that goes on: a third, one-byte fragment.
    let last_mark_at = 4 + half.len();
    stream[last_mark_at] &= 0x7F;
    stream.extend(framed(b"x"));
    assert_eq!(read_error(Script::whole(stream)), ErrorKind::InvalidData);
}

#[test]
fn a_stream_ending_inside_a_mark_is_unexpected() {
    for len in 1..4 {
        let stream = framed(b"abcd")[..len].to_vec();
        assert_eq!(
            read_error(Script::whole(stream)),
            ErrorKind::UnexpectedEof,
            "{len} mark bytes"
        );
    }
    // Between the fragments of a chain too.
    let mut stream = fragments(&[b"ab", b"cd"]);
    stream.truncate(6 + 2);
    assert_eq!(read_error(Script::whole(stream)), ErrorKind::UnexpectedEof);
}

#[test]
fn a_stream_ending_inside_a_body_is_unexpected() {
    for whole in [framed(&body(100, 1)), framed(&body(20_000, 2))] {
        for cut in [5, whole.len() / 2, whole.len() - 1] {
            let stream = whole[..cut].to_vec();
            assert_eq!(
                read_error(Script::whole(stream)),
                ErrorKind::UnexpectedEof,
                "cut at {cut}"
            );
        }
    }
}

#[test]
fn end_of_stream_between_records_is_clean() {
    let (got, reads) = read_all(Script::whole(Vec::new()));
    assert!(got.is_empty());
    assert_eq!(reads, 1);
    let (got, _) = read_all(Script::whole([framed(b"a"), framed(b"b")].concat()));
    assert_eq!(got.len(), 2);
}

#[test]
fn a_signal_at_every_position_loses_no_bytes() {
    let records = [body(50, 1), body(9000, 2), body(8188, 3)];
    let refs: Vec<&[u8]> = [&records[0][..], &records[1][..20], &records[1][20..]].to_vec();
    let mut stream = framed(refs[0]);
    stream.extend(fragments(&refs[1..]));
    stream.extend(framed(&records[2]));
    let want = vec![records[0].clone(), records[1].clone(), records[2].clone()];
    for at in 0..=stream.len() {
        let mut steps = vec![
            Step::Interrupt,
            Step::Interrupt,
            Step::Data(stream[at..].to_vec()),
        ];
        if at > 0 {
            steps.insert(0, Step::Data(stream[..at].to_vec()));
        }
        let (got, _) = read_all(Script::new(steps));
        assert!(got == want, "interrupted after {at} bytes: records differ");
    }
}

#[test]
fn only_interruption_is_restarted() {
    struct Failing;
    impl std::io::Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(ErrorKind::ConnectionReset.into())
        }
    }
    impl layerfs_rpc::Receive for Failing {}
    let mut records = Records::new(Failing);
    assert_eq!(
        records.next_record().unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
    assert_eq!(records.reads(), 1);
}

#[test]
fn a_socket_reads_large_records_into_their_own_buffers_without_taking_the_next() {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (receiver, _) = listener.accept().unwrap();
    let want = vec![
        body(100_000, 1),
        body(10, 2),
        body(9000, 3),
        body(1_500_000, 4),
        body(3, 5),
    ];
    let mut stream = Vec::new();
    for r in &want {
        stream.extend(framed(r));
    }
    let writer = std::thread::spawn(move || {
        // In uneven pieces, so reads end anywhere.
        for piece in stream.chunks(77_777) {
            sender.write_all(piece).unwrap();
        }
    });
    let mut records = Records::new(&receiver);
    for (i, w) in want.iter().enumerate() {
        let got = records.next_record().unwrap().unwrap();
        assert!(got.as_bytes() == w.as_slice(), "record {i} differs");
    }
    writer.join().unwrap();
    assert!(records.next_record().unwrap().is_none());
}
