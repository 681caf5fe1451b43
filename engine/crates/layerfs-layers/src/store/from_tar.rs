//! A layer from a tar stream, as OCI and Docker images carry them: whiteout
//! files stay as they are; PAX records give times to the nanosecond,
//! extended attributes (`SCHILY.xattr.`, as GNU tar and the container tools
//! write them) and sparse files ([`super::sparse`]).
//!
//! Two shapes other tools write and read are taken as they do:
//! - a stream that ends right after its last entry's data, without the
//!   padding to a 512-byte block or the two zero blocks that end an archive
//!   (`umoci insert` writes such layers, their `diff_id` the digest of
//!   exactly those bytes): it is read as if they were there, so long as the
//!   last entry's data is whole;
//! - a whiteout under a path its own layer made something other than a
//!   directory (`d2f` a file, then `d2f/.wh.inner`, as `umoci repack`
//!   writes a directory turned into a file): there is nothing under it to
//!   hide, and the layer writer drops it, as umoci and podman drop it.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::Timespec;
use tar::EntryType;

use super::sparse::{Records, Sparse};
use super::writer::{Body, LayerWriter, Meta, Refused};

/// Unpacks every entry of the tar stream `reader` into `layer` but those
/// at the paths `leave_out`.
pub(super) fn unpack(
    reader: impl Read,
    layer: &mut LayerWriter,
    leave_out: &[&str],
) -> io::Result<()> {
    let mut archive = tar::Archive::new(EndPadded::new(reader));
    // Where the data of the last entry read ends in the stream.
    let mut data_end = (PathBuf::new(), 0u64);
    for entry in archive.entries().map_err(damaged)? {
        let mut entry = entry.map_err(damaged)?;
        let path = entry.path().map_err(damaged)?.into_owned();
        data_end = (path.clone(), entry.raw_file_position() + entry.size());
        let plain: PathBuf = path
            .components()
            .filter(|c| !matches!(c, Component::CurDir | Component::RootDir))
            .collect();
        if leave_out.iter().any(|&left| plain == Path::new(left)) {
            continue;
        }
        let (meta, sparse) = meta_of(&mut entry).map_err(damaged)?;
        let link = entry.link_name().map_err(damaged)?.map(|l| l.into_owned());
        let header = entry.header();
        let kind = header.entry_type();
        let device = match kind {
            EntryType::Char | EntryType::Block => {
                let major = header.device_major().map_err(damaged)?.unwrap_or(0);
                let minor = header.device_minor().map_err(damaged)?.unwrap_or(0);
                rustix::fs::makedev(major, minor) as u64
            }
            _ => 0,
        };
        let mut sparse = sparse.filter(|_| kind.is_file() || kind == EntryType::Continuous);
        let path = match &sparse {
            Some(Sparse {
                name: Some(name), ..
            }) => name.clone(),
            _ => path,
        };
        let put = match (kind, &link) {
            (EntryType::Directory, _) => layer.put(&path, Body::Dir, &meta),
            (EntryType::Symlink, Some(link)) => layer.put(&path, Body::Symlink(link), &meta),
            (EntryType::Link, Some(link)) => layer.put(&path, Body::HardLink(link), &meta),
            (EntryType::Symlink | EntryType::Link, None) => {
                return Err(refusal(&path, "cannot be unpacked: a link with no target"))
            }
            (EntryType::Fifo, _) => layer.put(&path, Body::Fifo, &meta),
            (EntryType::Char, _) => layer.put(&path, Body::CharDevice(device), &meta),
            (EntryType::Block, _) => layer.put(&path, Body::BlockDevice(device), &meta),
            (
                EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink,
                _,
            ) => continue,
            _ => match &mut sparse {
                Some(sparse) => {
                    sparse
                        .read_map(&mut entry)
                        .map_err(|e| refusal(&path, &e.to_string()))?;
                    let (map, size) = (&sparse.map, sparse.size);
                    let body = Body::Sparse {
                        data: &mut entry,
                        map,
                        size,
                    };
                    layer.put(&path, body, &meta)
                }
                // POSIX: an unknown type is read as a regular file.
                None => layer.put(&path, Body::File(&mut entry), &meta),
            },
        };
        match put {
            Ok(()) => {}
            Err(Refused::Outside) => return Err(refusal(&path, super::OUTSIDE)),
            Err(Refused::Cannot(e)) => {
                if e.kind() == io::ErrorKind::InvalidData
                    || e.kind() == io::ErrorKind::UnexpectedEof
                {
                    return Err(damaged(e));
                }
                // Its kind kept: a full disk stays a full disk.
                let why = refusal(&path, &format!("cannot be unpacked: {e}"));
                return Err(io::Error::new(e.kind(), why.to_string()));
            }
        }
    }
    // Padding made up at the end of the stream stands in for what a writer
    // left out after the last entry, never for its data.
    if let Some(end) = archive.into_inner().end {
        if data_end.1 > end {
            return Err(damaged(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the stream ends inside the data of {:?}",
                    data_end.0.display().to_string()
                ),
            )));
        }
    }
    Ok(())
}

/// A stream followed, once it ends, by zeros to the end of its 512-byte
/// block and two zero blocks: the end of a tar archive, for a writer that
/// left it out. `end` says where the stream itself ended.
struct EndPadded<R> {
    inner: R,
    read: u64,
    end: Option<u64>,
    padding: u64,
}

impl<R> EndPadded<R> {
    fn new(inner: R) -> Self {
        EndPadded {
            inner,
            read: 0,
            end: None,
            padding: 0,
        }
    }
}

impl<R: Read> Read for EndPadded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.end.is_none() {
            let n = self.inner.read(buf)?;
            if n > 0 || buf.is_empty() {
                self.read += n as u64;
                return Ok(n);
            }
            self.end = Some(self.read);
            self.padding = (512 - self.read % 512) % 512 + 1024;
        }
        let n = (buf.len() as u64).min(self.padding) as usize;
        buf[..n].fill(0);
        self.padding -= n as u64;
        Ok(n)
    }
}

/// The entry's metadata, and what it says of a sparse file.
fn meta_of<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<(Meta, Option<Sparse>)> {
    let header = entry.header();
    // Fields an archiver left blank read as nothing, as GNU tar reads them.
    let mut meta = Meta {
        mode: header.mode().unwrap_or(0o644) & 0o7777,
        uid: header.uid().unwrap_or(0) as u32,
        gid: header.gid().unwrap_or(0) as u32,
        atime: None,
        mtime: header.mtime().ok().map(|secs| Timespec {
            tv_sec: secs as i64,
            tv_nsec: 0,
        }),
        xattrs: Vec::new(),
    };
    let mut sparse = Records::default();
    if let Some(records) = entry.pax_extensions()? {
        for record in records {
            let record = record?;
            let key = record.key_bytes();
            let value = record.value_bytes();
            if sparse.take(key, value)? {
                continue;
            }
            if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                let name = OsString::from(std::ffi::OsStr::from_bytes(name));
                meta.xattrs.push((name, value.to_vec()));
            } else if key == b"mtime" {
                meta.mtime = pax_time(value).or(meta.mtime);
            } else if key == b"atime" {
                meta.atime = pax_time(value);
            }
        }
    }
    Ok((meta, sparse.sparse()?))
}

/// A PAX time: decimal seconds, with an optional fraction.
fn pax_time(value: &[u8]) -> Option<Timespec> {
    let text = std::str::from_utf8(value).ok()?;
    let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
    let tv_sec: i64 = secs.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    let mut tv_nsec: i64 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    tv_nsec *= 10i64.pow(9 - digits.len() as u32);
    if tv_sec < 0 && tv_nsec > 0 {
        // "-1.5" is one and a half seconds before the epoch.
        return Some(Timespec {
            tv_sec: tv_sec - 1,
            tv_nsec: 1_000_000_000 - tv_nsec,
        });
    }
    Some(Timespec { tv_sec, tv_nsec })
}

fn refusal(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("entry {:?} {why}", path.display().to_string()),
    )
}

fn damaged(e: io::Error) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "not a tar archive, or a damaged one: {}",
            printable(&e.to_string())
        ),
    )
}

/// `text` on one line of printable characters: a field of a blob that is
/// not a tar archive can hold any bytes, which the tar reader quotes.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            c if c.is_control() || c == '\u{fffd}' => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::pax_time;

    #[test]
    fn pax_times_keep_their_nanoseconds() {
        let t = pax_time(b"1700000000.123456789").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (1_700_000_000, 123_456_789));
        let t = pax_time(b"5.5").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (5, 500_000_000));
        let t = pax_time(b"-1.25").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (-2, 750_000_000));
        assert!(pax_time(b"soon").is_none());
    }
}
