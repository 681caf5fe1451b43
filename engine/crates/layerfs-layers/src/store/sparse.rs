//! Sparse files in PAX archives, as GNU tar writes them with `--sparse`
//! (`tar --sparse --format=posix`): the entry holds only the file's data
//! blocks, and a map says where each goes in a file of a larger real size;
//! the rest is holes.
//!
//! Three versions are in use (GNU tar's manual, "Sparse Formats"):
//! - 0.0: `GNU.sparse.size`, `GNU.sparse.numblocks`, then
//!   `GNU.sparse.offset` and `GNU.sparse.numbytes` repeated per block;
//! - 0.1: the same with the map as one record, `GNU.sparse.map`
//!   ("offset,size,offset,size...");
//! - 1.0: `GNU.sparse.major`/`minor` 1/0, `GNU.sparse.name` and
//!   `GNU.sparse.realsize` in the records, and the map at the start of the
//!   entry's data: decimal numbers one per line (the count, then offset and
//!   size pairs), padded with NULs to a 512-byte block.
//!
//! Each version may name the file `DIR/GNUSparseFile.PID/NAME` in its header
//! and give the real name in `GNU.sparse.name`. A reader that knows none of
//! this unpacks the condensed data under that name, a wrong tree.

use std::io::{self, Read};
use std::path::PathBuf;

/// The most blocks a map may list: GNU tar writes one per run of data, and
/// a map of more than this is not a file worth unpacking.
const MAX_BLOCKS: usize = 1 << 20;
/// The largest real size taken: the holes are hashed as the zeros they read
/// as, so a hostile size would keep the import busy for ever.
pub(super) const MAX_SIZE: u64 = 1 << 40;
/// The longest 1.0 map read, in bytes.
const MAX_MAP_BYTES: u64 = 64 << 20;

/// A sparse file's real name and size and where its data blocks go.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Sparse {
    /// `GNU.sparse.name`, where given.
    pub name: Option<PathBuf>,
    pub size: u64,
    /// (offset, length) of each data block, in order.
    pub map: Vec<(u64, u64)>,
    /// Version 1.0: the map is at the start of the data, not yet read.
    map_in_data: bool,
}

/// Reads the `GNU.sparse.*` records among a PAX header's; None when there
/// are none (not a sparse file).
#[derive(Default)]
pub(super) struct Records {
    seen: bool,
    major: Option<u64>,
    name: Option<PathBuf>,
    size: Option<u64>,
    offsets: Vec<u64>,
    lengths: Vec<u64>,
    map: Option<Vec<u64>>,
}

impl Records {
    /// Takes one PAX record; false where it is not a sparse file's.
    pub fn take(&mut self, key: &[u8], value: &[u8]) -> io::Result<bool> {
        let Some(key) = key.strip_prefix(b"GNU.sparse.") else {
            return Ok(false);
        };
        self.seen = true;
        let number = || number_of(value, key);
        match key {
            b"major" => self.major = Some(number()?),
            b"name" => {
                use std::os::unix::ffi::OsStrExt;
                self.name = Some(std::ffi::OsStr::from_bytes(value).into());
            }
            b"size" | b"realsize" => self.size = Some(number()?),
            b"offset" => self.offsets.push(number()?),
            b"numbytes" => self.lengths.push(number()?),
            b"map" => {
                let numbers = value
                    .split(|&b| b == b',')
                    .filter(|n| !n.is_empty())
                    .map(|n| number_of(n, b"map"))
                    .collect::<io::Result<Vec<u64>>>()?;
                self.map = Some(numbers);
            }
            // minor, numblocks: implied by the rest.
            _ => {}
        }
        Ok(true)
    }

    /// The sparse file the records describe, if they describe one.
    pub fn sparse(self) -> io::Result<Option<Sparse>> {
        if !self.seen {
            return Ok(None);
        }
        let size = self
            .size
            .ok_or_else(|| bad("a sparse file without its real size"))?;
        let map_in_data = self.major == Some(1);
        let map = if map_in_data {
            Vec::new()
        } else if let Some(numbers) = self.map {
            pairs(&numbers)?
        } else {
            if self.offsets.len() != self.lengths.len() {
                return Err(bad("a sparse map whose offsets and sizes do not pair up"));
            }
            self.offsets.into_iter().zip(self.lengths).collect()
        };
        let sparse = Sparse {
            name: self.name,
            size,
            map,
            map_in_data,
        };
        if !map_in_data {
            sparse.check()?;
        }
        Ok(Some(sparse))
    }
}

impl Sparse {
    /// Reads a 1.0 map from the start of `data`, the entry's data, leaving
    /// it at the first data block. Nothing to read for the other versions.
    pub fn read_map(&mut self, data: &mut impl Read) -> io::Result<()> {
        if !self.map_in_data {
            return Ok(());
        }
        let mut read = 0u64;
        let mut line = Vec::new();
        let mut next = |data: &mut dyn Read, read: &mut u64| -> io::Result<u64> {
            line.clear();
            let mut byte = [0u8];
            loop {
                data.read_exact(&mut byte)
                    .map_err(|_| bad("a sparse map cut short"))?;
                *read += 1;
                if *read > MAX_MAP_BYTES {
                    return Err(bad("a sparse map too long"));
                }
                match byte[0] {
                    b'\n' => return number_of(&line, b"map"),
                    b => line.push(b),
                }
            }
        };
        let count = next(data, &mut read)? as usize;
        if count > MAX_BLOCKS {
            return Err(bad("a sparse map of too many blocks"));
        }
        let mut numbers = Vec::with_capacity(2 * count);
        for _ in 0..2 * count {
            numbers.push(next(data, &mut read)?);
        }
        // NULs to the end of its 512-byte block.
        let padding = (512 - read % 512) % 512;
        let skipped = io::copy(&mut data.take(padding), &mut io::sink())?;
        if skipped != padding {
            return Err(bad("a sparse map cut short"));
        }
        self.map = pairs(&numbers)?;
        self.map_in_data = false;
        self.check()
    }

    /// Blocks in order, apart, and inside the real size.
    fn check(&self) -> io::Result<()> {
        if self.size > MAX_SIZE {
            return Err(bad("a sparse file larger than 1 TiB"));
        }
        if self.map.len() > MAX_BLOCKS {
            return Err(bad("a sparse map of too many blocks"));
        }
        let mut end = 0u64;
        for &(offset, len) in &self.map {
            let block_end = offset
                .checked_add(len)
                .filter(|&e| offset >= end && e <= self.size)
                .ok_or_else(|| bad("a sparse map whose blocks overlap or pass its end"))?;
            end = block_end;
        }
        Ok(())
    }
}

fn pairs(numbers: &[u64]) -> io::Result<Vec<(u64, u64)>> {
    if !numbers.len().is_multiple_of(2) || numbers.len() / 2 > MAX_BLOCKS {
        return Err(bad("a sparse map whose offsets and sizes do not pair up"));
    }
    Ok(numbers.chunks(2).map(|p| (p[0], p[1])).collect())
}

fn number_of(text: &[u8], key: &[u8]) -> io::Result<u64> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| {
            bad(&format!(
                "GNU.sparse.{} is not a number",
                String::from_utf8_lossy(key)
            ))
        })
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(pairs: &[(&str, &str)]) -> io::Result<Option<Sparse>> {
        let mut r = Records::default();
        for (k, v) in pairs {
            r.take(k.as_bytes(), v.as_bytes())?;
        }
        r.sparse()
    }

    #[test]
    fn the_three_versions_give_one_map() {
        let want = vec![(0, 512), (8192, 100)];
        let v00 = records(&[
            ("GNU.sparse.size", "10000"),
            ("GNU.sparse.numblocks", "2"),
            ("GNU.sparse.offset", "0"),
            ("GNU.sparse.numbytes", "512"),
            ("GNU.sparse.offset", "8192"),
            ("GNU.sparse.numbytes", "100"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((v00.size, &v00.map), (10000, &want));
        let v01 = records(&[
            ("GNU.sparse.size", "10000"),
            ("GNU.sparse.numblocks", "2"),
            ("GNU.sparse.name", "dir/holey"),
            ("GNU.sparse.map", "0,512,8192,100"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((v01.size, &v01.map), (10000, &want));
        assert_eq!(v01.name.as_deref(), Some(std::path::Path::new("dir/holey")));
        let mut v10 = records(&[
            ("GNU.sparse.major", "1"),
            ("GNU.sparse.minor", "0"),
            ("GNU.sparse.name", "holey"),
            ("GNU.sparse.realsize", "10000"),
        ])
        .unwrap()
        .unwrap();
        let mut data = b"2\n0\n512\n8192\n100\n".to_vec();
        data.resize(512, 0);
        data.extend(b"DATA");
        let mut reader = &data[..];
        v10.read_map(&mut reader).unwrap();
        assert_eq!((v10.size, &v10.map), (10000, &want));
        assert_eq!(reader, b"DATA", "left at the first data block");
        assert_eq!(records(&[("path", "x")]).unwrap(), None);
    }

    #[test]
    fn a_map_that_overlaps_passes_its_end_or_is_cut_short_is_refused() {
        let refused = |pairs: &[(&str, &str)]| records(pairs).unwrap_err().to_string();
        assert!(
            refused(&[("GNU.sparse.size", "100"), ("GNU.sparse.map", "0,50,40,10")])
                .contains("overlap")
        );
        assert!(
            refused(&[("GNU.sparse.size", "100"), ("GNU.sparse.map", "90,20")])
                .contains("pass its end")
        );
        assert!(refused(&[
            ("GNU.sparse.size", "100"),
            ("GNU.sparse.map", &format!("{},1", u64::MAX))
        ])
        .contains("pass its end"));
        assert!(
            refused(&[("GNU.sparse.size", "100"), ("GNU.sparse.map", "0,1,2")]).contains("pair up")
        );
        assert!(refused(&[("GNU.sparse.map", "0,1")]).contains("real size"));
        assert!(refused(&[("GNU.sparse.size", "x")]).contains("not a number"));
        assert!(refused(&[("GNU.sparse.size", &(MAX_SIZE + 1).to_string())]).contains("1 TiB"));
        let mut v10 = records(&[("GNU.sparse.major", "1"), ("GNU.sparse.realsize", "10")])
            .unwrap()
            .unwrap();
        let e = v10.read_map(&mut &b"3\n0\n1\n"[..]).unwrap_err();
        assert!(e.to_string().contains("cut short"), "{e}");
        let mut v10 = records(&[("GNU.sparse.major", "1"), ("GNU.sparse.realsize", "10")])
            .unwrap()
            .unwrap();
        let e = v10.read_map(&mut &b"99999999999\n"[..]).unwrap_err();
        assert!(e.to_string().contains("too many"), "{e}");
    }
}
