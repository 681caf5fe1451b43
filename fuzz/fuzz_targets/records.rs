//! `Records` against a plain reading of RFC 5531 record marking, over a
//! stream cut into arbitrary chunks and interrupted at arbitrary points: the
//! same records, the same error, never more than the limit allocated.
#![no_main]

use std::io::{self, Read};

use layerfs_rpc::{Receive, Records, RECORD_LIMIT};
use libfuzzer_sys::fuzz_target;

/// A stream that hands out `data` in the chunk sizes given, with an EINTR
/// wherever the schedule says (never twice in a row: a real stream gets on).
struct Chunked<'a> {
    data: &'a [u8],
    at: usize,
    sizes: &'a [u8],
    step: usize,
    interrupted: bool,
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self
            .sizes
            .get(self.step % self.sizes.len().max(1))
            .copied()
            .unwrap_or(255);
        self.step += 1;
        if size == 0 && !self.interrupted {
            self.interrupted = true;
            return Err(io::ErrorKind::Interrupted.into());
        }
        self.interrupted = false;
        let size = size.max(1);
        let n = (size as usize)
            .min(buf.len())
            .min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Receive for Chunked<'_> {}

/// Records by the RFC, with the same limit: `Err` where the stream is
/// malformed.
fn reference(mut data: &[u8]) -> (Vec<Vec<u8>>, bool) {
    let mut records = Vec::new();
    let mut current = Vec::new();
    let mut inside = false;
    loop {
        if data.is_empty() {
            return (records, !inside);
        }
        if data.len() < 4 {
            return (records, false);
        }
        let mark = u32::from_be_bytes(data[..4].try_into().unwrap());
        let len = (mark & 0x7fff_ffff) as usize;
        data = &data[4..];
        if current.len() + len > RECORD_LIMIT {
            return (records, false);
        }
        if data.len() < len {
            return (records, false);
        }
        current.extend_from_slice(&data[..len]);
        data = &data[len..];
        inside = true;
        if mark & 0x8000_0000 != 0 {
            records.push(std::mem::take(&mut current));
            inside = false;
        }
    }
}

fuzz_target!(|input: (Vec<u8>, Vec<u8>)| {
    let (sizes, data) = input;
    let (want, clean_end) = reference(&data);
    let mut records = Records::new(Chunked {
        data: &data,
        at: 0,
        sizes: &sizes,
        step: 0,
        interrupted: false,
    });
    let mut got = Vec::new();
    let ended_cleanly = loop {
        match records.next_record() {
            Ok(Some(record)) => got.push(record.as_bytes().to_vec()),
            Ok(None) => break true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => panic!("EINTR leaked out"),
            Err(_) => break false,
        }
    };
    assert_eq!(got, want, "records differ from the RFC's reading");
    assert_eq!(
        ended_cleanly, clean_end,
        "the end of the stream read differently"
    );
});
