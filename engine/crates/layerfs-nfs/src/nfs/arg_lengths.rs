//! Every length in a call's arguments checked against the bytes that follow
//! it, before `nfs3_types` decodes them. Its decoder allocates what a length
//! claims before reading, so a handle or name claiming 4 GiB in a record of
//! a few bytes would have the server allocate 4 GiB (found by the
//! `nfs_calls` fuzz target). What the table in `procedures.rs` declares,
//! up to each procedure's last variable-length field, is walked here.

use layerfs_rpc::xdr::Cursor;
use nfs3_types::nfs3::NFS3_FHSIZE;

/// A field of a procedure's arguments, as far as lengths go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// A file handle: at most 64 bytes.
    Handle,
    /// A name or a path (SYMLINK's target, MOUNT's directory): as long as
    /// what follows; past the protocol's limits it gets its status
    /// (NAMETOOLONG), not GARBAGE_ARGS.
    Bytes,
    /// `sattr3`, which has no length but must be walked to reach what
    /// follows it.
    Sattr,
}

/// Whether every field's length fits in the bytes after it.
pub fn fit(fields: &[Field], args: &[u8]) -> bool {
    let mut r = Cursor::new(args);
    fields.iter().all(|field| match field {
        Field::Handle => r.opaque(NFS3_FHSIZE).is_some(),
        Field::Bytes => r.opaque(usize::MAX).is_some(),
        Field::Sattr => sattr(&mut r).is_some(),
    })
}

/// Whether `each` holds for every handle among the fields, as far as they
/// fit in `args`. A handle followed by a name is a directory and an entry
/// in it (`diropargs3`): `each` gets the name with it.
pub fn all_handles(
    fields: &[Field],
    args: &[u8],
    mut each: impl FnMut(&[u8], Option<&[u8]>) -> bool,
) -> bool {
    let mut r = Cursor::new(args);
    let mut fields = fields.iter().peekable();
    while let Some(field) = fields.next() {
        let fits = match field {
            Field::Handle => match r.opaque(NFS3_FHSIZE) {
                Some(handle) => {
                    let name = match fields.next_if_eq(&&Field::Bytes) {
                        Some(_) => r.opaque(usize::MAX),
                        None => None,
                    };
                    if !each(handle, name) {
                        return false;
                    }
                    true
                }
                None => false,
            },
            Field::Bytes => r.opaque(usize::MAX).is_some(),
            Field::Sattr => sattr(&mut r).is_some(),
        };
        if !fits {
            break;
        }
    }
    true
}

/// Walks an `sattr3`: mode, uid, gid (optional u32s), size (optional u64),
/// atime and mtime (don't change, server time, or a client time). Tells
/// whether it sets a size.
pub fn sattr(r: &mut Cursor<'_>) -> Option<bool> {
    let mut set = [false; 4];
    for (i, width) in [4, 4, 4, 8].into_iter().enumerate() {
        set[i] = r.u32()? != 0;
        if set[i] {
            r.take(width)?;
        }
    }
    for _ in 0..2 {
        if r.u32()? == 2 {
            r.take(8)?;
        }
    }
    Some(set[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opaque(bytes: &[u8]) -> Vec<u8> {
        let mut out = (bytes.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(bytes);
        out.resize(layerfs_rpc::xdr::padded(out.len()), 0);
        out
    }

    #[test]
    fn lengths_past_the_end_are_caught_before_decoding() {
        let mut lookup = opaque(&[1; 41]);
        lookup.extend(opaque(b"name"));
        assert!(fit(&[Field::Handle, Field::Bytes], &lookup));
        // A name claiming 4 GiB.
        let mut huge = opaque(&[1; 41]);
        huge.extend(u32::MAX.to_be_bytes());
        huge.extend(b"name");
        assert!(!fit(&[Field::Handle, Field::Bytes], &huge));
        // A handle past NFSv3's 64 bytes, or past the end.
        assert!(!fit(&[Field::Handle], &opaque(&[1; 65])));
        assert!(!fit(&[Field::Handle], &(100u32.to_be_bytes())));
        assert!(fit(&[], &[]));
    }

    #[test]
    fn every_handle_is_seen_up_to_the_end_of_what_fits() {
        let mut rename = opaque(&[1; 41]);
        rename.extend(opaque(b"from"));
        rename.extend(opaque(&[2; 41]));
        rename.extend(opaque(b"to"));
        let fields = [Field::Handle, Field::Bytes, Field::Handle, Field::Bytes];
        let mut seen = Vec::new();
        assert!(all_handles(&fields, &rename, |h, name| {
            seen.push((h[0], name.map(<[u8]>::to_vec)));
            true
        }));
        assert_eq!(
            seen,
            [(1, Some(b"from".to_vec())), (2, Some(b"to".to_vec()))]
        );
        assert!(
            !all_handles(&fields, &rename, |h, _| h[0] == 1),
            "the second"
        );
        // Cut inside the first name: only the first handle is there to see.
        seen.clear();
        assert!(all_handles(&fields, &rename[..50], |h, name| {
            seen.push((h[0], name.map(<[u8]>::to_vec)));
            true
        }));
        assert_eq!(seen, [(1, None)]);
        // LINK: a file, then a directory and the new name.
        let mut link = opaque(&[3; 41]);
        link.extend(opaque(&[4; 41]));
        link.extend(opaque(b"new"));
        seen.clear();
        let fields = [Field::Handle, Field::Handle, Field::Bytes];
        assert!(all_handles(&fields, &link, |h, name| {
            seen.push((h[0], name.map(<[u8]>::to_vec)));
            true
        }));
        assert_eq!(seen, [(3, None), (4, Some(b"new".to_vec()))]);
    }

    #[test]
    fn a_symlink_target_is_reached_past_its_attributes() {
        let mut symlink = opaque(&[1; 41]);
        symlink.extend(opaque(b"link"));
        // mode set, uid unset, gid unset, size set, atime server, mtime client
        for w in [1u32, 0o644, 0, 0, 1, 0, 7, 1, 2, 5, 6] {
            symlink.extend(w.to_be_bytes());
        }
        symlink.extend(opaque(b"target"));
        let fields = [Field::Handle, Field::Bytes, Field::Sattr, Field::Bytes];
        assert!(fit(&fields, &symlink));
        let cut = symlink.len() - 4;
        assert!(!fit(&fields, &symlink[..cut]));
    }
}
