//! Replies leave as one write per frame, whole, whatever the stream accepts.

mod support;

use std::io::{Read, Seek, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use layerfs_rpc::{FileTail, Frame, ReplyBuf, ReplyWriter, Transmit};
use support::{body, Sink};

fn frame(body_bytes: &[u8]) -> Frame {
    let mut reply = ReplyBuf::with_capacity(body_bytes.len());
    reply.extend_from_slice(body_bytes);
    reply.into_frame()
}

#[test]
fn a_frame_is_one_last_fragment() {
    let f = frame(b"abcdefgh");
    assert_eq!(&f.bytes()[..4], &[0x80, 0, 0, 8]);
    assert_eq!(&f.bytes()[4..], b"abcdefgh");
}

#[test]
fn a_small_reply_is_one_allocation_from_its_header_on() {
    // An accepted header is 24 bytes; the results packed after it, field by
    // field, must not move the buffer (each move is a realloc and a copy).
    let mut reply =
        layerfs_rpc::envelope::accepted_reply(7, layerfs_rpc::envelope::Accepted::Success);
    let at = reply.body().as_ptr();
    for _ in 0..(layerfs_rpc::reply::FIRST_ROOM - 24) / 4 {
        reply.write_all(&[1, 2, 3, 4]).unwrap();
    }
    assert_eq!(reply.body().as_ptr(), at, "the buffer moved");
    assert_eq!(reply.body_len(), layerfs_rpc::reply::FIRST_ROOM);
}

#[test]
fn a_reply_leaves_in_one_write() {
    for len in [0, 24, 8188, 8192, 1024 * 1024 + 100] {
        let writer = ReplyWriter::new(Sink::new(usize::MAX));
        let f = frame(&body(len, 1));
        writer.send(f.clone()).unwrap();
        assert_eq!(writer.writes(), 1, "{len}-byte body");
        assert_eq!(writer.bytes_out(), f.len() as u64);
    }
}

#[test]
fn partial_writes_are_continued_until_the_frame_is_out() {
    let sink = Sink::new(7);
    let writer = ReplyWriter::new(sink);
    let a = frame(&body(30, 1));
    let b = frame(&body(5, 2));
    writer.send(a.clone()).unwrap();
    writer.send(b.clone()).unwrap();
    assert_eq!(writer.bytes_out(), (a.len() + b.len()) as u64);
    assert_eq!(
        writer.writes(),
        (a.len().div_ceil(7) + b.len().div_ceil(7)) as u64
    );
}

#[test]
fn a_failed_write_breaks_the_writer_for_good() {
    struct Broken;
    impl Transmit for Broken {}
    impl std::io::Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::ConnectionReset.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let writer = ReplyWriter::new(Broken);
    assert_eq!(
        writer.send(frame(b"x")).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionReset
    );
    assert_eq!(
        writer.send(frame(b"y")).unwrap_err().kind(),
        std::io::ErrorKind::BrokenPipe
    );
    assert_eq!(writer.writes(), 1);
}

/// A temporary file holding `bytes`, as a descriptor a file tail can use.
fn file_with(bytes: &[u8]) -> Arc<OwnedFd> {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f.rewind().unwrap();
    Arc::new(OwnedFd::from(f))
}

fn tailed(head: &[u8], file: Arc<OwnedFd>, offset: u64, len: usize) -> Frame {
    let mut reply = ReplyBuf::with_capacity(head.len());
    reply.extend_from_slice(head);
    reply.set_file_tail(FileTail { file, offset, len });
    reply.into_frame()
}

/// What a frame looks like on the wire, written through a `Sink`.
fn wire(frames: Vec<Frame>) -> (Vec<u8>, u64) {
    let writer = ReplyWriter::new(Sink::new(usize::MAX));
    writer.send_all(frames).unwrap();
    let writes = writer.writes();
    let bytes = writer.into_inner().bytes;
    (bytes, writes)
}

#[test]
fn a_file_tail_follows_the_head_and_is_padded() {
    let data = body(10_001, 3);
    let f = tailed(b"head", file_with(&data), 0, data.len());
    assert_eq!(f.len(), 4 + 4 + 10_001 + 3);
    let (bytes, _) = wire(vec![frame(b"before"), f, frame(b"after")]);
    let mut want = frame(b"before").bytes().to_vec();
    want.extend_from_slice(&(0x8000_0000u32 | (4 + 10_001 + 3)).to_be_bytes());
    want.extend_from_slice(b"head");
    want.extend_from_slice(&data);
    want.extend_from_slice(&[0; 3]);
    want.extend_from_slice(frame(b"after").bytes());
    assert!(bytes == want, "frames on the wire differ");
}

#[test]
fn a_file_that_shrank_is_sent_as_zeros_to_keep_the_stream_in_step() {
    let f = tailed(b"", file_with(b"short"), 2, 100);
    let (bytes, _) = wire(vec![f]);
    assert_eq!(bytes.len(), 4 + 100);
    assert_eq!(&bytes[4..7], b"ort");
    assert!(bytes[7..].iter().all(|&b| b == 0));
}

#[test]
fn a_socket_sends_the_file_tail_from_the_kernel() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    let data = body(3 * 1024 * 1024 + 1, 9);
    let frames = vec![
        tailed(b"head", file_with(&data), 1, data.len() - 1),
        frame(b"next"),
    ];
    let total: usize = frames.iter().map(Frame::len).sum();
    let reader = std::thread::spawn(move || {
        let mut got = vec![0; total];
        (&client).read_exact(&mut got).unwrap();
        got
    });
    let writer = ReplyWriter::new(server);
    writer.send_all(frames).unwrap();
    let got = reader.join().unwrap();
    assert_eq!(&got[4..8], b"head");
    assert!(got[8..8 + data.len() - 1] == data[1..], "file bytes differ");
    assert_eq!(&got[got.len() - 8..], frame(b"next").bytes());
}
