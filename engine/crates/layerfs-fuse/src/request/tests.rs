//! Reading requests' arguments: both layouts alike, every cut refused.

use zerocopy::IntoBytes;

use super::*;
use crate::abi::Rename2In;

/// Samples of each request the door serves with arguments: the
/// operation's struct, then what follows it.
fn samples() -> Vec<(u32, Vec<u8>, Vec<u8>)> {
    let write = WriteIn {
        size: 5,
        ..Default::default()
    };
    let setxattr = SetxattrIn { size: 3, flags: 1 };
    vec![
        (op::LOOKUP, vec![], b"name\0".to_vec()),
        (op::SYMLINK, vec![], b"link\0target\0".to_vec()),
        (
            op::MKNOD,
            MknodIn::default().as_bytes().to_vec(),
            b"n\0".to_vec(),
        ),
        (
            op::MKDIR,
            MkdirIn::default().as_bytes().to_vec(),
            b"d\0".to_vec(),
        ),
        (op::UNLINK, vec![], b"u\0".to_vec()),
        (op::RMDIR, vec![], b"r\0".to_vec()),
        (
            op::RENAME,
            RenameIn { newdir: 7 }.as_bytes().to_vec(),
            b"a\0b\0".to_vec(),
        ),
        (
            op::RENAME2,
            Rename2In::default().as_bytes().to_vec(),
            b"a\0b\0".to_vec(),
        ),
        (
            op::LINK,
            LinkIn { oldnodeid: 3 }.as_bytes().to_vec(),
            b"l\0".to_vec(),
        ),
        (op::WRITE, write.as_bytes().to_vec(), b"hello".to_vec()),
        (
            op::SETXATTR,
            setxattr.as_bytes().to_vec(),
            b"user.k\0abc".to_vec(),
        ),
        (
            op::GETXATTR,
            GetxattrIn::default().as_bytes().to_vec(),
            b"user.k\0".to_vec(),
        ),
        (op::REMOVEXATTR, vec![], b"user.k\0".to_vec()),
        (
            op::CREATE,
            CreateIn::default().as_bytes().to_vec(),
            b"c\0".to_vec(),
        ),
        (
            op::SETATTR,
            SetattrIn::default().as_bytes().to_vec(),
            vec![],
        ),
        (op::OPEN, OpenIn::default().as_bytes().to_vec(), vec![]),
        (op::READ, ReadIn::default().as_bytes().to_vec(), vec![]),
        (
            op::RELEASE,
            ReleaseIn::default().as_bytes().to_vec(),
            vec![],
        ),
        (op::FSYNC, FsyncIn::default().as_bytes().to_vec(), vec![]),
        (op::ACCESS, AccessIn::default().as_bytes().to_vec(), vec![]),
        (
            op::FALLOCATE,
            FallocateIn::default().as_bytes().to_vec(),
            vec![],
        ),
        (
            op::READDIRPLUS,
            ReadIn::default().as_bytes().to_vec(),
            vec![],
        ),
        (
            op::LISTXATTR,
            GetxattrIn::default().as_bytes().to_vec(),
            vec![],
        ),
    ]
}

fn parsed(opcode: u32, body: Body<'_>) -> String {
    format!("{:?}", Request::parse(opcode, body))
}

#[test]
fn a_ring_s_layout_and_dev_fuse_s_are_read_alike() {
    for (opcode, op, rest) in samples() {
        let whole = [op.as_slice(), &rest].concat();
        let split = parsed(opcode, Body::split(&op, &rest, 0));
        assert!(split.starts_with("Ok("), "{opcode}: {split}");
        assert_eq!(split, parsed(opcode, Body::whole(&whole, 0)), "{opcode}");
    }
    let newdir_in = 7u64.to_ne_bytes();
    let Ok(Request::Rename {
        newdir,
        name,
        newname,
        ..
    }) = Request::parse(op::RENAME, Body::split(&newdir_in, b"a\0b\0", 0))
    else {
        panic!("not a rename")
    };
    assert_eq!((newdir, name, newname), (7, &b"a"[..], &b"b"[..]));
    let Ok(Request::Setxattr { name, value, flags }) = Request::parse(
        op::SETXATTR,
        Body::split(&[3, 0, 0, 0, 1, 0, 0, 0], b"user.k\0abc", 0),
    ) else {
        panic!("not a setxattr")
    };
    assert_eq!((name, value, flags), (&b"user.k"[..], &b"abc"[..], 1));
}

#[test]
fn a_read_asks_for_no_more_than_the_largest_read_the_kernel_is_let_send() {
    for (size, read) in [
        (0, 0),
        (4096, 4096),
        (MAX_WRITE, MAX_WRITE),
        (MAX_WRITE + 1, MAX_WRITE),
        (u32::MAX, MAX_WRITE),
    ] {
        let arg = ReadIn {
            offset: 7,
            size,
            ..Default::default()
        };
        let Ok(Request::Read(got)) = Request::parse(op::READ, Body::whole(arg.as_bytes(), 0))
        else {
            panic!("not a read")
        };
        assert_eq!((got.offset, got.size), (7, read), "asked {size}");
    }
}

#[test]
fn every_cut_of_a_request_is_refused() {
    for (opcode, op, rest) in samples() {
        let whole = [op.as_slice(), &rest].concat();
        // A WRITE's data is as long as it is: a short one is written short.
        let cuts = match opcode {
            op::WRITE => op.len(),
            _ => whole.len(),
        };
        for cut in 0..cuts {
            let got = Request::parse(opcode, Body::whole(&whole[..cut], 0));
            assert!(got.is_err(), "{opcode} cut at {cut}: {got:?}");
        }
    }
}

#[test]
fn extensions_after_the_arguments_are_left_out() {
    // One 8-byte extension (a caller's groups, say) after a name.
    let payload = [&b"name\0"[..], &[0xff; 8]].concat();
    let Ok(Request::Lookup { name }) = Request::parse(op::LOOKUP, Body::split(&[], &payload, 1))
    else {
        panic!("not read")
    };
    assert_eq!(name, b"name");
    let write = WriteIn {
        size: 64,
        ..Default::default()
    };
    let data = [&b"data"[..], &[0xee; 8]].concat();
    let Ok(Request::Write { data, .. }) =
        Request::parse(op::WRITE, Body::split(write.as_bytes(), &data, 1))
    else {
        panic!("not read")
    };
    assert_eq!(data, b"data");
}

#[test]
fn an_empty_name_is_refused_and_an_unknown_request_kept_for_enosys() {
    for opcode in [op::LOOKUP, op::UNLINK, op::RMDIR, op::REMOVEXATTR] {
        let got = Request::parse(opcode, Body::whole(b"\0", 0));
        assert!(matches!(got, Err(Errno::EINVAL)), "{opcode}: {got:?}");
    }
    let renamed_to_nothing = Request::parse(op::RENAME, Body::split(&[0; 8], b"a\0\0", 0));
    assert!(matches!(renamed_to_nothing, Err(Errno::EINVAL)));
    assert!(matches!(
        Request::parse(46, Body::whole(&[0; 24], 0)),
        Ok(Request::Other(46))
    ));
}
