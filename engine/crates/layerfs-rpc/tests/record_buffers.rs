//! A large record's buffer is kept for the next one, and a kept buffer
//! larger than the record takes only the record's bytes from the socket. In
//! a test binary of its own: the kept buffers are one process-wide pool.

mod support;

use std::io::Write;
use std::net::{TcpListener, TcpStream};

use layerfs_rpc::{Record, Records};
use support::{body, framed};

#[test]
fn a_released_buffer_is_taken_again_and_reads_no_further_than_its_record() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (receiver, _) = listener.accept().unwrap();
    let want = [
        body(1_000_000, 1),
        body(70_000, 2),
        body(10, 3),
        body(70_000, 4),
        body(5, 5),
    ];
    let stream: Vec<u8> = want.iter().flat_map(|r| framed(r)).collect();
    // All at once: each large record's bytes are followed by the next's in
    // the socket, there for a read to take too many.
    let writer = std::thread::spawn(move || sender.write_all(&stream).unwrap());

    let mut records = Records::new(&receiver);
    let first = records.next_record().unwrap().unwrap();
    assert!(first.as_bytes() == want[0].as_slice());
    let kept = first.as_bytes().as_ptr();
    first.release();

    let second = records.next_record().unwrap().unwrap();
    let Record::Owned(bytes) = &second else {
        panic!("a 70,000-byte record has a buffer of its own");
    };
    assert_eq!(bytes.as_ptr(), kept, "the released buffer, taken again");
    assert!(bytes.capacity() >= 1_000_000);
    assert!(bytes.as_slice() == want[1].as_slice(), "record 1 differs");
    second.release();

    for (i, w) in want.iter().enumerate().skip(2) {
        let got = records.next_record().unwrap().unwrap();
        assert!(got.as_bytes() == w.as_slice(), "record {i} differs");
        got.release();
    }
    writer.join().unwrap();
    assert!(records.next_record().unwrap().is_none());
}
