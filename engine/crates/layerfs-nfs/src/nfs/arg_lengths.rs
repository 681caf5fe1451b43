//! Every length in a call's arguments checked against the bytes that follow
//! it, before `nfs3_types` decodes them. Its decoder allocates what a length
//! claims before reading, so a handle or name claiming 4 GiB in a record of
//! a few bytes would have the server allocate 4 GiB (found by the
//! `nfs_calls` fuzz target). What the table in `procedures.rs` declares,
//! up to each procedure's last variable-length field, is walked here, once
//! for the call's placement and once for the call: the same walk finds the
//! handles (for the export and the placement) and whether a SETATTR sets a
//! size.

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

/// Most handles a procedure's arguments carry (RENAME and LINK: two).
const MOST_HANDLES: usize = 2;

/// A handle in a call's arguments, with the name after it where one follows
/// (`diropargs3`: a directory and an entry in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleArg<'a> {
    pub handle: &'a [u8],
    pub entry: Option<&'a [u8]>,
}

/// What one walk of a call's arguments finds, over the fields the procedure
/// table declares for it: placement and the call each read their answers
/// from one walk.
#[derive(Debug)]
pub struct Walk<'a> {
    /// Every field's length fits in the bytes after it.
    pub fits: bool,
    /// The handles, in order, as far as the fields fit.
    handles: [Option<HandleArg<'a>>; MOST_HANDLES],
    /// A `sattr3` among the fields sets a size.
    pub sets_size: bool,
    /// The bytes after the last field walked.
    pub rest: &'a [u8],
}

impl<'a> Walk<'a> {
    pub fn handles(&self) -> impl Iterator<Item = HandleArg<'a>> + '_ {
        self.handles.iter().flatten().copied()
    }

    /// The handle the arguments start with (every procedure's but NULL's).
    pub fn first_handle(&self) -> Option<&'a [u8]> {
        self.handles[0].map(|h| h.handle)
    }
}

/// Walks `args` over `fields`, checking each length against the bytes
/// after it, up to the first that does not fit.
pub fn walk<'a>(fields: &[Field], args: &'a [u8]) -> Walk<'a> {
    let mut r = Cursor::new(args);
    let mut walk = Walk {
        fits: false,
        handles: [None; MOST_HANDLES],
        sets_size: false,
        rest: args,
    };
    let mut found = 0;
    let mut fields = fields.iter().peekable();
    while let Some(field) = fields.next() {
        let fits = match field {
            Field::Handle => match r.opaque(NFS3_FHSIZE) {
                Some(handle) => {
                    let named = fields.next_if_eq(&&Field::Bytes).is_some();
                    let entry = if named { r.opaque(usize::MAX) } else { None };
                    walk.handles[found] = Some(HandleArg { handle, entry });
                    found += 1;
                    !named || entry.is_some()
                }
                None => false,
            },
            Field::Bytes => r.opaque(usize::MAX).is_some(),
            Field::Sattr => match sattr(&mut r) {
                Some(sets_size) => {
                    walk.sets_size |= sets_size;
                    true
                }
                None => false,
            },
        };
        if !fits {
            return walk;
        }
    }
    walk.fits = true;
    walk.rest = r.rest();
    walk
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

    fn fit(fields: &[Field], args: &[u8]) -> bool {
        walk(fields, args).fits
    }

    fn seen(fields: &[Field], args: &[u8]) -> Vec<(u8, Option<Vec<u8>>)> {
        walk(fields, args)
            .handles()
            .map(|h| (h.handle[0], h.entry.map(<[u8]>::to_vec)))
            .collect()
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
        assert_eq!(
            seen(&fields, &rename),
            [(1, Some(b"from".to_vec())), (2, Some(b"to".to_vec()))]
        );
        assert_eq!(walk(&fields, &rename).first_handle(), Some(&[1; 41][..]));
        // Cut inside the first name: only the first handle is there to see.
        assert_eq!(seen(&fields, &rename[..50]), [(1, None)]);
        assert!(!fit(&fields, &rename[..50]));
        // LINK: a file, then a directory and the new name.
        let mut link = opaque(&[3; 41]);
        link.extend(opaque(&[4; 41]));
        link.extend(opaque(b"new"));
        let fields = [Field::Handle, Field::Handle, Field::Bytes];
        assert_eq!(
            seen(&fields, &link),
            [(3, None), (4, Some(b"new".to_vec()))]
        );
        // What follows the last field is left for the procedure.
        let mut write = opaque(&[5; 41]);
        write.extend([9; 12]);
        let w = walk(&[Field::Handle], &write);
        assert_eq!((w.fits, w.rest), (true, &[9; 12][..]));
    }

    #[test]
    fn no_procedure_carries_more_handles_than_a_walk_holds() {
        for number in 0..=21 {
            let proc = super::super::procedures::Proc::from_number(number).unwrap();
            let handles = proc.lengths().iter().filter(|f| **f == Field::Handle);
            assert!(handles.count() <= MOST_HANDLES, "{}", proc.name());
        }
    }

    #[test]
    fn a_setattr_that_truncates_is_told_from_one_that_does_not() {
        let setattr = |words: &[u32]| {
            let mut out = opaque(&[7; 33]);
            for w in words {
                out.extend(w.to_be_bytes());
            }
            out
        };
        let fields = [Field::Handle, Field::Sattr];
        // mode 0600, gid 7; no size; times kept.
        let chmod = setattr(&[1, 0o600, 0, 1, 7, 0, 0, 0]);
        assert!(walk(&fields, &chmod).fits);
        assert!(!walk(&fields, &chmod).sets_size);
        // uid 7, size 0.
        let truncate = setattr(&[0, 1, 7, 0, 1, 0, 0, 0, 0]);
        assert!(walk(&fields, &truncate).sets_size);
        assert!(!walk(&fields, &truncate[..truncate.len() - 4]).fits);
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
