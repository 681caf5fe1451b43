//! Replies leave as one write per frame, whole, whatever the stream accepts.

mod support;

use layerfs_rpc::{ReplyBuf, ReplyWriter};
use support::{body, Sink};

fn frame(body_bytes: &[u8]) -> Vec<u8> {
    let mut reply = ReplyBuf::with_capacity(body_bytes.len());
    reply.extend_from_slice(body_bytes);
    reply.into_frame()
}

#[test]
fn a_frame_is_one_last_fragment() {
    let f = frame(b"abcdefgh");
    assert_eq!(&f[..4], &[0x80, 0, 0, 8]);
    assert_eq!(&f[4..], b"abcdefgh");
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
