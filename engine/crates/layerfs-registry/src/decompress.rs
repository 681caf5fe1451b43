//! A layer blob's bytes as the tar stream they compress.
//!
//! Both compressions a layer may use are read whole: a gzip blob may be
//! several members one after another (eStargz writes one per file), and a
//! zstd blob several frames, skippable ones among them (zstd:chunked keeps
//! its table of contents in one). A decoder that stopped after the first
//! would hand on a tar stream cut short.

use std::io::{self, BufRead, BufReader, Read};

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

use crate::{Error, ErrorKind};

/// How a layer's tar stream is stored in its blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The compression a layer's media type names.
    pub(crate) fn of(media_type: &str) -> Result<Compression, Error> {
        const LAYERS: [&str; 2] = [
            "application/vnd.oci.image.layer.v1.tar",
            "application/vnd.docker.image.rootfs.diff.tar",
        ];
        let unknown = |why: &str| {
            Error::new(
                ErrorKind::Registry,
                format!("unknown media type {media_type:?}{why}"),
            )
        };
        let Some(rest) = LAYERS.iter().find_map(|l| media_type.strip_prefix(l)) else {
            return Err(unknown(": not an image layer"));
        };
        match rest {
            "" => Ok(Compression::None),
            "+gzip" | ".gzip" => Ok(Compression::Gzip),
            "+zstd" | ".zstd" => Ok(Compression::Zstd),
            _ => Err(unknown("")),
        }
    }

    /// A lazy layer's piece from `range`, its compressed bytes in the blob:
    /// exactly its length, after what comes before it in the stream (a
    /// member may go on into the next entry's header, or hold other files
    /// first). What cannot be decompressed is an error.
    pub(crate) fn piece(
        self,
        range: &[u8],
        piece: &layerfs_layers::lazy::Piece,
    ) -> io::Result<Vec<u8>> {
        let mut data = Vec::with_capacity(piece.len as usize);
        let mut decoder = self.decoder(range);
        io::copy(&mut (&mut decoder).take(piece.skip), &mut io::sink())?;
        decoder.take(piece.len).read_to_end(&mut data)?;
        Ok(data)
    }

    /// A reader of the whole tar stream `blob` holds.
    pub(crate) fn decoder<'a>(self, blob: impl Read + 'a) -> Box<dyn Read + 'a> {
        match self {
            Compression::None => Box::new(blob),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(blob)),
            Compression::Zstd => Box::new(ZstdFrames::new(blob)),
        }
    }
}

/// Every frame of a zstd stream, decoded in turn; skippable frames are
/// passed over. (ruzstd's own streaming decoder reads one frame.)
struct ZstdFrames<R> {
    source: BufReader<R>,
    decoder: FrameDecoder,
    /// Whether a frame has begun and may hold more.
    in_frame: bool,
}

impl<R: Read> ZstdFrames<R> {
    fn new(source: R) -> Self {
        ZstdFrames {
            source: BufReader::new(source),
            decoder: FrameDecoder::new(),
            in_frame: false,
        }
    }

    /// Begins the next frame; false at the end of the stream.
    fn next_frame(&mut self) -> io::Result<bool> {
        loop {
            if self.source.fill_buf()?.is_empty() {
                return Ok(false);
            }
            match self.decoder.reset(&mut self.source) {
                Ok(()) => return Ok(true),
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let skipped =
                        io::copy(&mut (&mut self.source).take(length.into()), &mut io::sink())?;
                    if skipped != u64::from(length) {
                        return Err(zstd_error("a skippable frame cut short"));
                    }
                }
                Err(e) => return Err(zstd_error(&e.to_string())),
            }
        }
    }
}

impl<R: Read> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.in_frame {
                while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                    self.decoder
                        .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                        .map_err(|e| zstd_error(&e.to_string()))?;
                }
                let n = self.decoder.read(buf)?;
                if n > 0 {
                    return Ok(n);
                }
                self.in_frame = false;
            }
            if !self.next_frame()? {
                return Ok(0);
            }
            self.in_frame = true;
        }
    }
}

fn zstd_error(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn decoded(compression: Compression, blob: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        compression.decoder(blob).read_to_end(&mut out)?;
        Ok(out)
    }

    fn zstd_frame(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    /// A skippable frame (magic 0x184D2A50..5F) of `payload`.
    fn skippable(payload: &[u8]) -> Vec<u8> {
        let mut frame = 0x184D_2A5Eu32.to_le_bytes().to_vec();
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    fn gzip_member(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn every_zstd_frame_is_read_and_skippable_ones_passed_over() {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut blob = zstd_frame(b"first ");
        blob.extend(skippable(b"a table of contents"));
        blob.extend(zstd_frame(&big));
        blob.extend(zstd_frame(b""));
        blob.extend(zstd_frame(b" last"));
        blob.extend(skippable(b""));
        let mut want = b"first ".to_vec();
        want.extend(&big);
        want.extend(b" last");
        assert_eq!(decoded(Compression::Zstd, &blob).unwrap(), want);
    }

    #[test]
    fn a_zstd_stream_cut_short_or_damaged_is_an_error() {
        let mut blob = zstd_frame(b"first");
        let whole = blob.len();
        blob.extend(skippable(b"0123456789"));
        let cut = &blob[..blob.len() - 3];
        let e = decoded(Compression::Zstd, cut).unwrap_err();
        assert!(e.to_string().contains("skippable frame cut short"), "{e}");
        let mut damaged = blob[..whole].to_vec();
        damaged.extend(b"not zstd at all");
        let e = decoded(Compression::Zstd, &damaged).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn every_gzip_member_is_read() {
        let mut blob = gzip_member(b"one ");
        blob.extend(gzip_member(b"two "));
        blob.extend(gzip_member(b"three"));
        assert_eq!(decoded(Compression::Gzip, &blob).unwrap(), b"one two three");
    }

    #[test]
    fn media_types_name_their_compression() {
        let of = |t: &str| Compression::of(t);
        assert_eq!(
            of("application/vnd.oci.image.layer.v1.tar+zstd"),
            Ok(Compression::Zstd)
        );
        assert_eq!(
            of("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Ok(Compression::Gzip)
        );
        assert_eq!(
            of("application/vnd.oci.image.layer.v1.tar"),
            Ok(Compression::None)
        );
        assert!(of("application/vnd.oci.image.layer.v1.tar+lz4").is_err());
        assert!(of("text/plain").is_err());
    }
}
