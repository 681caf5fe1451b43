//! Arguments decoded in place, borrowing handles, names and WRITE's payload
//! from the record: `nfs3_types` copies each into a buffer of its own, an
//! allocation or more per call that the quick procedures and WRITE skip.

use layerfs_rpc::xdr::Cursor;
use layerfs_rpc::Refusal;
use layerfs_vfs::Stability;
use nfs3_types::nfs3::NFS3_FHSIZE;

/// WRITE3args with the handle and the data borrowed from the record:
/// `nfs3_types` would copy both (the payload up to 1 MiB) into buffers of
/// their own first.
pub struct WriteArgs<'a> {
    pub file: &'a [u8],
    pub offset: u64,
    pub stable: Stability,
    pub data: &'a [u8],
}

impl<'a> WriteArgs<'a> {
    pub fn decode(args: &'a [u8]) -> Result<WriteArgs<'a>, Refusal> {
        Self::read(&mut Cursor::new(args)).ok_or(Refusal::GarbageArgs)
    }

    fn read(r: &mut Cursor<'a>) -> Option<WriteArgs<'a>> {
        let file = r.opaque(NFS3_FHSIZE)?;
        let offset = r.u64()?;
        let count = r.u32()? as usize;
        let stable = match r.u32()? {
            0 => Stability::Unstable,
            1 => Stability::DataSync,
            2 => Stability::FileSync,
            _ => return None,
        };
        // The data's padding may be missing from the end of the record.
        let len = r.u32()? as usize;
        let data = r.take(len)?;
        Some(WriteArgs {
            file,
            offset,
            stable,
            data: &data[..count.min(len)],
        })
    }
}

/// The handle that GETATTR's and READLINK's arguments are.
pub fn handle(args: &[u8]) -> Result<&[u8], Refusal> {
    Cursor::new(args)
        .opaque(NFS3_FHSIZE)
        .ok_or(Refusal::GarbageArgs)
}

/// LOOKUP3args: the directory's handle and the name.
pub fn lookup(args: &[u8]) -> Result<(&[u8], &[u8]), Refusal> {
    let mut r = Cursor::new(args);
    let dir = r.opaque(NFS3_FHSIZE).ok_or(Refusal::GarbageArgs)?;
    let name = r.opaque(usize::MAX).ok_or(Refusal::GarbageArgs)?;
    Ok((dir, name))
}

/// ACCESS3args: the handle and the access bits asked about.
pub fn access(args: &[u8]) -> Result<(&[u8], u32), Refusal> {
    let mut r = Cursor::new(args);
    let fh = r.opaque(NFS3_FHSIZE).ok_or(Refusal::GarbageArgs)?;
    let asked = r.u32().ok_or(Refusal::GarbageArgs)?;
    Ok((fh, asked))
}

/// Whether WRITE3args, read from past their handle, ask for an UNSTABLE
/// WRITE of at most [`MAX_TRANSFER`](crate::nfs::MAX_TRANSFER) bytes: a
/// copy into the page cache, with no fsync to wait for.
pub fn is_unstable(after_handle: &[u8]) -> bool {
    let mut r = Cursor::new(after_handle);
    let head = r.u64().and_then(|_| Some((r.u32()?, r.u32()?)));
    matches!(head, Some((count, 0)) if count <= crate::nfs::MAX_TRANSFER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfs3_types::nfs3::nfs_fh3;
    use nfs3_types::nfs3::{stable_how, WRITE3args};
    use nfs3_types::xdr_codec::Opaque;
    use nfs3_types::xdr_codec::Pack;

    fn packed(args: &WRITE3args<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        args.pack(&mut out).unwrap();
        out
    }

    fn sample(data: &[u8]) -> WRITE3args<'_> {
        WRITE3args {
            file: nfs_fh3 {
                data: Opaque::owned(vec![7; 25]),
            },
            offset: 0x1_0000_0002,
            count: data.len() as u32,
            stable: stable_how::DATA_SYNC,
            data: Opaque::borrowed(data),
        }
    }

    #[test]
    fn write_args_borrow_the_payload() {
        let bytes = packed(&sample(b"payload!x"));
        let a = WriteArgs::decode(&bytes).unwrap();
        assert_eq!(a.file, &[7; 25]);
        assert_eq!((a.offset, a.stable), (0x1_0000_0002, Stability::DataSync));
        assert_eq!(a.data, b"payload!x");
        let at = bytes.len() - 12;
        assert!(
            std::ptr::eq(a.data.as_ptr(), bytes[at..].as_ptr()),
            "not copied"
        );
    }

    #[test]
    fn the_quick_procedures_arguments_borrow_their_handles_and_names() {
        use nfs3_types::nfs3::{diropargs3, filename3, ACCESS3args, LOOKUP3args};
        let fh = nfs_fh3 {
            data: Opaque::owned(vec![7; 41]),
        };
        let mut bytes = Vec::new();
        let what = diropargs3 {
            dir: fh.clone(),
            name: filename3(Opaque::borrowed(b"name")),
        };
        LOOKUP3args { what }.pack(&mut bytes).unwrap();
        let (dir, name) = lookup(&bytes).unwrap();
        assert_eq!((dir, name), (&[7; 41][..], &b"name"[..]));
        assert!(
            std::ptr::eq(dir.as_ptr(), bytes[4..].as_ptr()),
            "not copied"
        );
        for cut in [0, 3, 44, bytes.len() - 5] {
            assert!(lookup(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bytes = Vec::new();
        ACCESS3args {
            object: fh.clone(),
            access: 0x1f,
        }
        .pack(&mut bytes)
        .unwrap();
        assert_eq!(access(&bytes).unwrap(), (&[7; 41][..], 0x1f));
        assert!(access(&bytes[..bytes.len() - 1]).is_err());
        assert_eq!(handle(&bytes).unwrap(), &[7; 41][..]);
        let mut long = bytes;
        long[..4].copy_from_slice(&65u32.to_be_bytes());
        assert!(handle(&long).is_err(), "past NFSv3's 64 bytes");
    }

    #[test]
    fn only_unstable_writes_within_the_transfer_size_are_told_unstable() {
        use crate::nfs::arg_lengths::{walk, Field};
        let is_unstable = |args: &[u8]| is_unstable(walk(&[Field::Handle], args).rest);
        let most = crate::nfs::MAX_TRANSFER as usize;
        let data = vec![0; most + 1];
        let mut a = sample(&data[..most]);
        assert!(!is_unstable(&packed(&a)), "DATA_SYNC");
        a.stable = stable_how::UNSTABLE;
        assert!(is_unstable(&packed(&a)));
        assert!(!is_unstable(&packed(&a)[..40]), "cut before its stability");
        a.data = Opaque::borrowed(&data);
        a.count = data.len() as u32;
        assert!(!is_unstable(&packed(&a)), "past the size");
    }

    #[test]
    fn malformed_write_args_are_garbage() {
        let good = packed(&sample(b"data"));
        for cut in [0, 3, 20, good.len() - 5] {
            assert!(WriteArgs::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut long_fh = good.clone();
        long_fh[..4].copy_from_slice(&65u32.to_be_bytes());
        assert!(WriteArgs::decode(&long_fh).is_err());
        let mut huge = good.clone();
        let len_at = good.len() - 8;
        huge[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(
            WriteArgs::decode(&huge).is_err(),
            "a length past the record"
        );
        let mut bad_stable = good;
        let stable_at = len_at - 4;
        bad_stable[stable_at..stable_at + 4].copy_from_slice(&3u32.to_be_bytes());
        assert!(WriteArgs::decode(&bad_stable).is_err());
    }
}
