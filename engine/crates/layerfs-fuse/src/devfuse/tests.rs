//! Requests laid out as `/dev/fuse` gives them, through [`step`], without
//! a kernel: what is answered, from which buffer, and what is not.

use std::sync::Arc;

use layerfs_vfs::LocalFs;
use zerocopy::IntoBytes;

use super::*;
use crate::abi::ReadIn;
use crate::attrs::Caching;

const ROOT: u64 = 1;

fn door(dir: &std::path::Path) -> Door {
    let fs = LocalFs::open(dir).unwrap();
    Door::new(Arc::new(fs), Caching::Shared)
}

/// Puts request `opcode` on `nodeid`, its arguments `args` and
/// `extensions` 8-byte units after them, in `buffers` as one read gives
/// it; returns its length.
fn put(buffers: &mut Buffers, (opcode, nodeid): (u32, u64), args: &[u8], extensions: u16) -> usize {
    let len = IN_HEADER_LEN + args.len() + 8 * usize::from(extensions);
    let header = InHeader {
        len: len as u32,
        opcode,
        unique: 40 + u64::from(opcode),
        nodeid,
        total_extlen: extensions,
        ..Default::default()
    };
    buffers.request[..IN_HEADER_LEN].copy_from_slice(header.as_bytes());
    buffers.request[IN_HEADER_LEN..IN_HEADER_LEN + args.len()].copy_from_slice(args);
    // Extensions the door does not read: a name must not run into them.
    let extension = &mut buffers.request[IN_HEADER_LEN + args.len()..len];
    extension.fill(b'x');
    if let Some(last) = extension.last_mut() {
        *last = 0;
    }
    len
}

fn answered(then: Then) -> OutHeader {
    match then {
        Then::Answer(out) => out,
        other => panic!("not an answer: {other:?}"),
    }
}

#[test]
fn a_lookup_is_answered_as_the_dispatcher_answers_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"data").unwrap();
    let d = door(dir.path());
    let mut buffers = Buffers::new();
    let len = put(&mut buffers, (opcode::LOOKUP, ROOT), b"f\0", 0);
    let out = answered(step(&d, &mut buffers, len));
    assert_eq!((out.error, out.unique), (0, 40 + 1));
    let body = buffers.body(&out).to_vec();
    assert_eq!(out.len as usize, wire::OUT_HEADER_LEN + body.len());
    let mut direct = Answered::default();
    let header = InHeader {
        opcode: opcode::LOOKUP,
        nodeid: ROOT,
        ..Default::default()
    };
    let request = crate::request::Request::parse(header.opcode, Body::split(&[], b"f\0", 0));
    wire::answer(&d, &header, request, &mut direct);
    assert_eq!(body, direct.body, "as a ring's LOOKUP is answered");

    let len = put(&mut buffers, (opcode::LOOKUP, ROOT), b"nothing\0", 0);
    let out = answered(step(&d, &mut buffers, len));
    assert_eq!(
        (out.error, out.len as usize),
        (-libc::ENOENT, wire::OUT_HEADER_LEN)
    );
    assert!(buffers.body(&out).is_empty());
    assert_eq!(
        d.routes().counted(),
        (2, 0),
        "two requests through /dev/fuse"
    );
}

#[test]
fn the_extensions_after_the_arguments_are_left_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"data").unwrap();
    let d = door(dir.path());
    let mut buffers = Buffers::new();
    let len = put(&mut buffers, (opcode::LOOKUP, ROOT), b"f\0", 1);
    assert_eq!(answered(step(&d, &mut buffers, len)).error, 0);
    // A name without its NUL must not end in the extension: "fxxxxxxx".
    std::fs::write(dir.path().join("fxxxxxxx"), b"").unwrap();
    let len = put(&mut buffers, (opcode::LOOKUP, ROOT), b"f", 1);
    assert_eq!(answered(step(&d, &mut buffers, len)).error, -libc::EINVAL);
}

#[test]
fn a_read_names_its_bytes_on_the_host_and_a_copy_answers_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("f"), &content).unwrap();
    let d = door(dir.path());
    let mut buffers = Buffers::new();
    let len = put(&mut buffers, (opcode::LOOKUP, ROOT), b"f\0", 0);
    let out = answered(step(&d, &mut buffers, len));
    let nodeid = u64::from_ne_bytes(buffers.body(&out)[..8].try_into().unwrap());
    for (offset, size) in [
        (0u64, 4096u32),
        (1000, 131_072),
        (290_000, 131_072),
        (400_000, 10),
    ] {
        let read = ReadIn {
            offset,
            size,
            ..Default::default()
        };
        let len = put(&mut buffers, (opcode::READ, nodeid), read.as_bytes(), 0);
        let Then::Read(unique, source) = step(&d, &mut buffers, len) else {
            panic!("a READ of a host file not answered from it");
        };
        assert_eq!(unique, 40 + u64::from(opcode::READ));
        let out = buffers.copy(unique, &source);
        assert!(buffers.direct, "read into the answer's buffer");
        let from = (offset as usize).min(content.len());
        let to = (from + size as usize).min(content.len());
        assert_eq!(out.error, 0);
        assert_eq!(buffers.body(&out), &content[from..to], "at {offset}");
    }
    // The next answer's body is the dispatcher's again.
    let len = put(&mut buffers, (opcode::GETATTR, nodeid), &[0; 16], 0);
    let out = answered(step(&d, &mut buffers, len));
    assert!(!buffers.direct);
    assert_eq!(buffers.body(&out).len(), 104, "fuse_attr_out");
}

#[test]
fn forgets_get_no_answer_and_an_interrupt_gets_enosys() {
    let dir = tempfile::tempdir().unwrap();
    let d = door(dir.path());
    let mut buffers = Buffers::new();
    let len = put(&mut buffers, (opcode::FORGET, 5), &1u64.to_ne_bytes(), 0);
    assert!(matches!(step(&d, &mut buffers, len), Then::Nothing));
    let batch = [1u32.to_ne_bytes(), [0; 4]].concat();
    let len = put(&mut buffers, (opcode::BATCH_FORGET, 0), &batch, 0);
    assert!(matches!(step(&d, &mut buffers, len), Then::Nothing));
    // The kernel takes ENOSYS as "no interrupts here" and sends no more.
    let len = put(&mut buffers, (opcode::INTERRUPT, 0), &7u64.to_ne_bytes(), 0);
    let out = answered(step(&d, &mut buffers, len));
    assert_eq!(out.error, -libc::ENOSYS);
    assert_eq!(d.routes().counted(), (0, 0), "none of them counted");
}

#[test]
fn destroy_is_answered_and_ends_the_reading() {
    let dir = tempfile::tempdir().unwrap();
    let d = door(dir.path());
    let mut buffers = Buffers::new();
    let len = put(&mut buffers, (opcode::DESTROY, 0), &[], 0);
    match step(&d, &mut buffers, len) {
        Then::AnswerAndEnd(out) => assert_eq!((out.error, out.len), (0, 16)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_request_whose_length_is_not_its_headers_is_answered_eio() {
    let dir = tempfile::tempdir().unwrap();
    let d = door(dir.path());
    let mut buffers = Buffers::new();
    let len = put(&mut buffers, (opcode::LOOKUP, ROOT), b"f\0", 0);
    let out = answered(step(&d, &mut buffers, len - 1));
    assert_eq!((out.error, out.unique), (-libc::EIO, 41));
    assert!(matches!(
        step(&d, &mut buffers, IN_HEADER_LEN - 1),
        Then::Nothing
    ));
    let out = answered(step(&d, &mut buffers, IN_HEADER_LEN));
    assert_eq!(out.error, -libc::EIO, "a header that says more than came");
}

#[test]
fn the_first_write_makes_the_request_buffer_resident_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"").unwrap();
    let d = door(dir.path());
    let mut buffers = Buffers::new();
    assert!(!buffers.resident);
    let len = put(&mut buffers, (opcode::LOOKUP, ROOT), b"f\0", 0);
    step(&d, &mut buffers, len);
    assert!(!buffers.resident, "not for a LOOKUP");
    let len = put(&mut buffers, (opcode::WRITE, 99), &[0; 40], 0);
    step(&d, &mut buffers, len);
    assert!(buffers.resident);
}
