//! Each procedure's arguments as `nfs3_types` packs them, decoded here to
//! the same values; every cut short, or with a length past the record, is
//! refused.

use super::*;
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Pack};

/// A check that names a handle by its length and first byte, so a test
/// sees which handle went where.
fn check(bytes: &[u8]) -> Checked {
    match bytes.first() {
        Some(&first) => Ok(FileHandle {
            export: bytes.len() as u64,
            fileid: u64::from(first),
            generation: 0,
        }),
        None => Err(Error::BadHandle),
    }
}

fn decode(proc: Proc, args: &[u8]) -> Option<Args> {
    Args::decode(proc, args, &mut check)
}

fn packed(value: &impl Pack) -> Vec<u8> {
    let mut out = Vec::new();
    value.pack(&mut out).unwrap();
    out
}

fn fh(first: u8) -> nfs_fh3 {
    nfs_fh3 {
        data: Opaque::owned(vec![first; 41]),
    }
}

fn checked(first: u8) -> Checked {
    check(&[first; 41])
}

fn name(s: &'static [u8]) -> filename3<'static> {
    filename3(Opaque::borrowed(s))
}

fn dirop(first: u8, s: &'static [u8]) -> diropargs3<'static> {
    diropargs3 {
        dir: fh(first),
        name: name(s),
    }
}

/// A `sattr3` with every field set: mode, uid, gid, size, a client atime
/// and the server's mtime.
fn every_attr() -> (sattr3, SetAttr) {
    let theirs = sattr3 {
        mode: Nfs3Option::Some(0o4755),
        uid: Nfs3Option::Some(1000),
        gid: Nfs3Option::Some(u32::MAX),
        size: Nfs3Option::Some(1 << 40),
        atime: set_atime::SET_TO_CLIENT_TIME(nfstime3 {
            seconds: 1_700_000_000,
            nseconds: 5,
        }),
        mtime: set_mtime::SET_TO_SERVER_TIME,
    };
    let ours = SetAttr {
        mode: Some(0o4755),
        uid: Some(1000),
        gid: Some(u32::MAX),
        size: Some(1 << 40),
        atime: SetTime::Client(Timestamp {
            secs: 1_700_000_000,
            nanos: 5,
        }),
        mtime: SetTime::ServerNow,
    };
    (theirs, ours)
}

/// Every procedure's arguments packed by `nfs3_types`, with what they
/// decode to; names are checked apart (spans).
fn samples() -> Vec<(Proc, Vec<u8>)> {
    let (sattr, _) = every_attr();
    vec![
        (Proc::Null, vec![]),
        (Proc::Getattr, packed(&GETATTR3args { object: fh(1) })),
        (
            Proc::Setattr,
            packed(&SETATTR3args {
                object: fh(1),
                new_attributes: sattr.clone(),
                guard: Nfs3Option::Some(nfstime3 {
                    seconds: 9,
                    nseconds: 2_000_000_000,
                }),
            }),
        ),
        (
            Proc::Lookup,
            packed(&LOOKUP3args {
                what: dirop(1, b"n"),
            }),
        ),
        (
            Proc::Access,
            packed(&ACCESS3args {
                object: fh(1),
                access: 0x1f,
            }),
        ),
        (Proc::Readlink, packed(&READLINK3args { symlink: fh(1) })),
        (
            Proc::Read,
            packed(&READ3args {
                file: fh(1),
                offset: 1 << 33,
                count: 4096,
            }),
        ),
        (
            Proc::Write,
            packed(&WRITE3args {
                file: fh(1),
                offset: 7,
                count: 5,
                stable: stable_how::FILE_SYNC,
                data: Opaque::borrowed(b"hello"),
            }),
        ),
        (
            Proc::Create,
            packed(&CREATE3args {
                where_: dirop(1, b"new"),
                how: createhow3::EXCLUSIVE(createverf3([9; 8])),
            }),
        ),
        (
            Proc::Mkdir,
            packed(&MKDIR3args {
                where_: dirop(1, b"d"),
                attributes: sattr.clone(),
            }),
        ),
        (
            Proc::Symlink,
            packed(&SYMLINK3args {
                where_: dirop(1, b"l"),
                symlink: symlinkdata3 {
                    symlink_attributes: sattr.clone(),
                    symlink_data: nfspath3(Opaque::borrowed(b"target")),
                },
            }),
        ),
        (
            Proc::Mknod,
            packed(&MKNOD3args {
                where_: dirop(1, b"c"),
                what: mknoddata3::NF3CHR(devicedata3 {
                    dev_attributes: sattr.clone(),
                    spec: specdata3 {
                        specdata1: 1,
                        specdata2: 7,
                    },
                }),
            }),
        ),
        (
            Proc::Remove,
            packed(&REMOVE3args {
                object: dirop(1, b"f"),
            }),
        ),
        (
            Proc::Rmdir,
            packed(&RMDIR3args {
                object: dirop(1, b"d"),
            }),
        ),
        (
            Proc::Rename,
            packed(&RENAME3args {
                from: dirop(1, b"from"),
                to: dirop(2, b"to"),
            }),
        ),
        (
            Proc::Link,
            packed(&LINK3args {
                file: fh(1),
                link: dirop(2, b"new"),
            }),
        ),
        (
            Proc::Readdir,
            packed(&READDIR3args {
                dir: fh(1),
                cookie: 3,
                cookieverf: cookieverf3([4; 8]),
                count: 8192,
            }),
        ),
        (
            Proc::Readdirplus,
            packed(&READDIRPLUS3args {
                dir: fh(1),
                cookie: 3,
                cookieverf: cookieverf3([4; 8]),
                dircount: 1024,
                maxcount: 65536,
            }),
        ),
        (Proc::Fsstat, packed(&FSSTAT3args { fsroot: fh(1) })),
        (Proc::Fsinfo, packed(&FSINFO3args { fsroot: fh(1) })),
        (Proc::Pathconf, packed(&PATHCONF3args { object: fh(1) })),
        (
            Proc::Commit,
            packed(&COMMIT3args {
                file: fh(1),
                offset: 5,
                count: 6,
            }),
        ),
    ]
}

#[test]
fn every_procedure_decodes_what_nfs3_types_packs() {
    let (_, set) = every_attr();
    let span = |args: &[u8], s: Span| s.of(args).to_vec();
    let samples = samples();
    assert_eq!(samples.len(), 22, "one per procedure");
    for (proc, args) in &samples {
        let a = decode(*proc, args).unwrap_or_else(|| panic!("{}", proc.name()));
        let first = a.handles()[0].map(|h| h.handle);
        if *proc != Proc::Null {
            assert_eq!(first, Some(checked(1)), "{}", proc.name());
        }
        match a {
            Args::Setattr { set: s, guard, .. } => {
                assert_eq!(s, set);
                // Nanoseconds past a second are taken as its last one.
                let nanos = 999_999_999;
                assert_eq!(guard, Some(Timestamp { secs: 9, nanos }));
            }
            Args::Lookup(at) => assert_eq!(span(args, at.name), b"n"),
            Args::Access { asked, .. } => assert_eq!(asked, 0x1f),
            Args::Read { offset, count, .. } => assert_eq!((offset, count), (1 << 33, 4096)),
            Args::Write {
                offset,
                stable,
                data,
                ..
            } => {
                assert_eq!((offset, stable), (7, Stability::FileSync));
                assert_eq!(span(args, data), b"hello");
            }
            Args::Create { at, how } => {
                assert_eq!(span(args, at.name), b"new");
                assert_eq!(how, Create::Exclusive([9; 8]));
            }
            Args::Mkdir { at, set: s } => {
                assert_eq!((span(args, at.name), s), (b"d".to_vec(), set))
            }
            Args::Symlink { at, set: s, target } => {
                assert_eq!((span(args, at.name), s), (b"l".to_vec(), set));
                assert_eq!(span(args, target), b"target");
            }
            Args::Mknod { at, node } => {
                assert_eq!(span(args, at.name), b"c");
                assert_eq!(node, Some((FileKind::CharDevice, (1, 7), set)));
            }
            Args::Remove(at) | Args::Rmdir(at) => {
                assert!(matches!(&span(args, at.name)[..], b"f" | b"d"))
            }
            Args::Rename { from, to } => {
                assert_eq!(span(args, from.name), b"from");
                assert_eq!((to.dir, span(args, to.name)), (checked(2), b"to".to_vec()));
            }
            Args::Link { at, .. } => {
                assert_eq!((at.dir, span(args, at.name)), (checked(2), b"new".to_vec()))
            }
            Args::Readdir {
                cookie,
                verf,
                count,
                ..
            } => assert_eq!((cookie, verf, count), (3, [4; 8], 8192)),
            Args::Readdirplus {
                cookie,
                verf,
                dircount,
                maxcount,
                ..
            } => assert_eq!((cookie, verf, dircount, maxcount), (3, [4; 8], 1024, 65536)),
            Args::Commit { offset, count, .. } => assert_eq!((offset, count), (5, 6)),
            Args::Null
            | Args::Getattr(_)
            | Args::Readlink(_)
            | Args::Fsstat(_)
            | Args::Fsinfo(_)
            | Args::Pathconf(_) => {}
        }
    }
}

#[test]
fn arguments_cut_anywhere_are_refused() {
    for (proc, args) in samples() {
        for cut in 0..args.len() {
            // A WRITE's data may be sent without its padding.
            let padding_only = proc == Proc::Write && cut >= args.len() - 3;
            if !padding_only {
                assert_eq!(
                    decode(proc, &args[..cut]),
                    None,
                    "{} cut at {cut}",
                    proc.name()
                );
            }
        }
    }
}

#[test]
fn lengths_past_the_record_or_the_protocol_are_refused() {
    let mut huge = packed(&LOOKUP3args {
        what: dirop(1, b"n"),
    });
    let name_at = 4 + 44;
    huge[name_at..name_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(decode(Proc::Lookup, &huge), None, "a name claiming 4 GiB");
    let mut long = packed(&GETATTR3args { object: fh(1) });
    long.resize(4 + 68, 1);
    long[..4].copy_from_slice(&65u32.to_be_bytes());
    assert_eq!(decode(Proc::Getattr, &long), None, "a handle past 64 bytes");
    // A name longer than any filesystem takes is the call's to refuse.
    let long_name: &'static [u8] = Box::leak(vec![b'x'; 5000].into_boxed_slice());
    let args = packed(&LOOKUP3args {
        what: dirop(1, long_name),
    });
    let Some(Args::Lookup(at)) = decode(Proc::Lookup, &args) else {
        panic!("a long name")
    };
    assert_eq!(at.name.len(), 5000);
}

#[test]
fn enums_and_bools_outside_their_values_are_refused() {
    let word_at = |args: &mut Vec<u8>, at: usize, v: u32| {
        args[at..at + 4].copy_from_slice(&v.to_be_bytes());
    };
    let after_fh = 4 + 44;
    // WRITE's stable_how: 3.
    let mut write = samples()[7].1.clone();
    word_at(&mut write, after_fh + 12, 3);
    assert_eq!(decode(Proc::Write, &write), None);
    // SETATTR's `mode` bool: 2.
    let mut setattr = samples()[2].1.clone();
    word_at(&mut setattr, after_fh, 2);
    assert_eq!(decode(Proc::Setattr, &setattr), None);
    // CREATE's mode: 3.
    let mut create = samples()[8].1.clone();
    word_at(&mut create, after_fh + 8, 3);
    assert_eq!(decode(Proc::Create, &create), None);
    // MKNOD of a regular file is BADTYPE, not garbage; of type 8, garbage.
    let mut mknod = samples()[11].1.clone();
    word_at(&mut mknod, after_fh + 8, 1);
    assert!(matches!(
        decode(Proc::Mknod, &mknod),
        Some(Args::Mknod { node: None, .. })
    ));
    word_at(&mut mknod, after_fh + 8, 8);
    assert_eq!(decode(Proc::Mknod, &mknod), None);
}

#[test]
fn a_write_borrows_at_most_count_bytes_and_no_padding() {
    let data = [7u8; 9];
    let mut args = WRITE3args {
        file: fh(1),
        offset: 0,
        count: 4,
        stable: stable_how::UNSTABLE,
        data: Opaque::borrowed(&data),
    };
    let bytes = packed(&args);
    let Some(Args::Write { data: span, .. }) = decode(Proc::Write, &bytes) else {
        panic!("WRITE")
    };
    assert_eq!(span.of(&bytes), &[7; 4], "count is less than the data");
    assert!(std::ptr::eq(
        span.of(&bytes).as_ptr(),
        bytes[bytes.len() - 12..].as_ptr()
    ));
    args.count = 100;
    let bytes = packed(&args);
    let Some(Args::Write { data: span, .. }) = decode(Proc::Write, &bytes[..bytes.len() - 3])
    else {
        panic!("WRITE without padding")
    };
    assert_eq!(span.of(&bytes), &data, "count is more than the data");
}

#[test]
fn each_handle_is_checked_once_in_order() {
    let (_, args) = &samples()[14];
    let mut seen = Vec::new();
    let decoded = Args::decode(Proc::Rename, args, &mut |b: &[u8]| {
        seen.push(b[0]);
        check(b)
    });
    assert!(decoded.is_some());
    assert_eq!(seen, [1, 2]);
    let handles = decoded.unwrap().handles();
    let entries: Vec<_> = handles
        .iter()
        .flatten()
        .map(|h| h.entry.map(|s| s.of(args).to_vec()))
        .collect();
    assert_eq!(entries, [Some(b"from".to_vec()), Some(b"to".to_vec())]);
}
