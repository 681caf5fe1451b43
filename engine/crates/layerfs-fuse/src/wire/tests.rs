//! Requests in the kernel's layout through [`answer`], checked against
//! the bytes the kernel reads and the host's files.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use layerfs_vfs::LocalFs;
use zerocopy::IntoBytes;

use super::reply::{system_time, time};
use super::*;
use std::mem::size_of;

use crate::abi::{
    self, opcode::*, AccessIn, Dirent, DirentPlus, FallocateIn, FsyncIn, GetxattrIn, LinkIn,
    MkdirIn, MknodIn, OpenIn, ReadIn, Rename2In, RenameIn, SetxattrIn,
};
use crate::attrs::Caching;

const ROOT: u64 = 1;

fn header(opcode: u32, nodeid: u64) -> InHeader {
    InHeader {
        len: 0,
        opcode,
        unique: 9,
        nodeid,
        uid: 0,
        gid: 0,
        pid: std::process::id(),
        total_extlen: 0,
        padding: 0,
    }
}

// The kernel's offsets, read on their own: a check of the typed layout.
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

/// Answers one request laid out as a ring lays it out (the operation's
/// struct in `op`, names and data in `payload`), and checks that the same
/// request laid out as `/dev/fuse` gives it is read alike: for a request
/// that changes nothing, the same answer.
fn ask(door: &Door, opcode: u32, nodeid: u64, op: &[u8], payload: &[u8]) -> Answered {
    let mut out = Answered {
        error: 1,
        body: b"stale".to_vec(),
    };
    let h = header(opcode, nodeid);
    answer(
        door,
        &h,
        Request::parse(h.opcode, Body::split(op, payload, 0)),
        &mut out,
    );
    if matches!(
        opcode,
        GETATTR | LOOKUP | READ | READDIR | READDIRPLUS | STATFS | ACCESS | READLINK
    ) {
        let whole = [op, payload].concat();
        let mut again = Answered::default();
        answer(
            door,
            &h,
            Request::parse(h.opcode, Body::whole(&whole, 0)),
            &mut again,
        );
        assert_eq!(
            (again.error, unchanging(opcode, &again.body)),
            (out.error, unchanging(opcode, &out.body)),
            "one buffer"
        );
    }
    out
}

/// What two answers to the same request must agree on: a STATFS's free
/// blocks and inodes change with whatever else writes to the host's
/// filesystem between the two.
fn unchanging(opcode: u32, body: &[u8]) -> Vec<u8> {
    match abi::args::<abi::StatfsOut>(body) {
        Some(statfs) if opcode == STATFS => {
            let fixed = abi::StatfsOut {
                bfree: 0,
                bavail: 0,
                ffree: 0,
                ..statfs
            };
            [fixed.as_bytes(), &body[size_of::<abi::StatfsOut>()..]].concat()
        }
        _ => body.to_vec(),
    }
}

fn door(dir: &std::path::Path, caching: Caching) -> Door {
    let fs = LocalFs::open(dir).unwrap();
    Door::new(Arc::new(fs), caching)
}

fn words(op: &[u32]) -> Vec<u8> {
    op.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

#[test]
fn a_header_is_read_where_the_kernel_puts_each_field() {
    let mut b = [0u8; IN_HEADER_LEN];
    b[0..4].copy_from_slice(&77u32.to_ne_bytes());
    b[4..8].copy_from_slice(&CREATE.to_ne_bytes());
    b[8..16].copy_from_slice(&5u64.to_ne_bytes());
    b[16..24].copy_from_slice(&6u64.to_ne_bytes());
    b[24..28].copy_from_slice(&1000u32.to_ne_bytes());
    b[28..32].copy_from_slice(&100u32.to_ne_bytes());
    b[32..36].copy_from_slice(&42u32.to_ne_bytes());
    b[36..38].copy_from_slice(&3u16.to_ne_bytes());
    let h: InHeader = abi::args(&b).unwrap();
    assert_eq!(
        (
            h.len,
            h.opcode,
            h.unique,
            h.nodeid,
            h.uid,
            h.gid,
            h.pid,
            h.total_extlen
        ),
        (77, CREATE, 5, 6, 1000, 100, 42, 3)
    );
    let out = out_header(5, -2, 8);
    let out = out.as_bytes();
    assert_eq!(&out[0..4], &24u32.to_ne_bytes(), "the header counts itself");
    assert_eq!(&out[4..8], &(-2i32).to_ne_bytes());
    assert_eq!(&out[8..16], &5u64.to_ne_bytes());
    assert!(
        abi::args::<InHeader>(&b[..IN_HEADER_LEN - 1]).is_none(),
        "too short"
    );
}

#[test]
fn times_before_the_epoch_count_their_nanoseconds_forward() {
    let t = |d: Duration| time(UNIX_EPOCH - d);
    assert_eq!(t(Duration::new(1, 500_000_000)), (-2, 500_000_000));
    assert_eq!(t(Duration::from_secs(3)), (-3, 0));
    assert_eq!(time(UNIX_EPOCH + Duration::new(7, 9)), (7, 9));
    for (secs, nanos) in [(-2, 500_000_000), (-3, 0), (7, 9), (0, 1)] {
        assert_eq!(time(system_time(secs, nanos)), (secs, nanos), "read back");
    }
}

/// `struct fuse_setattr_in` with `valid`, size, times, mode, uid, gid.
fn setattr_in_of(valid: u32, size: u64, times: [(i64, u32); 2], ids: [u32; 3]) -> Vec<u8> {
    let mut b = vec![0u8; 88];
    b[0..4].copy_from_slice(&valid.to_ne_bytes());
    b[16..24].copy_from_slice(&size.to_ne_bytes());
    b[32..40].copy_from_slice(&times[0].0.to_ne_bytes());
    b[40..48].copy_from_slice(&times[1].0.to_ne_bytes());
    b[56..60].copy_from_slice(&times[0].1.to_ne_bytes());
    b[60..64].copy_from_slice(&times[1].1.to_ne_bytes());
    for (at, word) in [68, 76, 80].into_iter().zip(ids) {
        b[at..at + 4].copy_from_slice(&word.to_ne_bytes());
    }
    b
}

#[test]
fn a_setattr_sets_what_its_valid_bits_name_and_answers_the_attributes() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"hello world").unwrap();
    let d = door(dir.path(), Caching::Shared);
    let nodeid = u64_at(&ask(&d, LOOKUP, ROOT, &[], b"f\0").body, 0);
    let meta = std::fs::metadata(dir.path().join("f")).unwrap();
    // Size, mode and the modification time; the access time and the
    // owner are there but not valid.
    let valid = fattr::SIZE | fattr::MODE | fattr::MTIME;
    let op = setattr_in_of(valid, 5, [(1, 2), (-2, 500_000_000)], [0o100600, 7, 8]);
    let set = ask(&d, SETATTR, nodeid, &op, &[]);
    assert_eq!((set.error, set.body.len()), (0, 16 + 88), "fuse_attr_out");
    let now = std::fs::metadata(dir.path().join("f")).unwrap();
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"hello");
    assert_eq!(now.mode() & 0o7777, 0o600);
    assert_eq!((now.mtime(), now.mtime_nsec()), (-2, 500_000_000));
    assert_eq!((now.atime(), now.uid()), (meta.atime(), meta.uid()));
    assert_eq!(u64_at(&set.body, 16 + 8), 5, "the answer's size");
    // The access time set to now.
    let op = setattr_in_of(fattr::ATIME | fattr::ATIME_NOW, 0, [(1, 2), (0, 0)], [0; 3]);
    assert_eq!(ask(&d, SETATTR, nodeid, &op, &[]).error, 0);
    let now = std::fs::metadata(dir.path().join("f")).unwrap();
    assert!(
        now.atime() > 1,
        "not the time in the request: {}",
        now.atime()
    );
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"hello");
    // A request too short for its arguments.
    let short = ask(&d, SETATTR, nodeid, &[0; 40], &[]);
    assert_eq!(short.error, -libc::EIO);
}

#[test]
fn a_lookup_and_a_getattr_are_laid_out_as_struct_fuse_entry_out_and_attr_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"hello").unwrap();
    let d = door(dir.path(), Caching::Shared);
    let found = ask(&d, LOOKUP, ROOT, &[], b"f\0");
    assert_eq!(found.error, 0);
    let b = &found.body;
    assert_eq!(b.len(), 40 + 88, "fuse_entry_out");
    let nodeid = u64_at(b, 0);
    assert_ne!(nodeid, 0);
    assert_eq!(
        u64_at(b, 16),
        1,
        "entry_valid: one second for a shared directory"
    );
    assert_eq!(u64_at(b, 40), nodeid, "fuse_attr.ino");
    assert_eq!(u64_at(b, 48), 5, "fuse_attr.size");
    let meta = std::fs::metadata(dir.path().join("f")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(u64_at(b, 40 + 32) as i64, meta.mtime(), "fuse_attr.mtime");
    assert_eq!(
        u32_at(b, 40 + 52),
        meta.mtime_nsec() as u32,
        "fuse_attr.mtimensec"
    );
    assert_eq!(u32_at(b, 40 + 60), meta.mode(), "fuse_attr.mode");
    assert_eq!(u32_at(b, 40 + 64), 1, "fuse_attr.nlink");
    assert_eq!(u32_at(b, 40 + 80), 4096, "fuse_attr.blksize");

    let attr = ask(&d, GETATTR, nodeid, &[0; 16], &[]);
    assert_eq!(attr.error, 0);
    assert_eq!(attr.body.len(), 16 + 88, "fuse_attr_out");
    assert_eq!(&attr.body[16..], &b[40..], "the same attributes");

    let missing = ask(&d, LOOKUP, ROOT, &[], b"nothing\0");
    assert_eq!((missing.error, missing.body.len()), (-libc::ENOENT, 0));
    // Where nothing changes behind the door, a negative entry instead.
    let d = door(dir.path(), Caching::Exclusive);
    let negative = ask(&d, LOOKUP, ROOT, &[], b"nothing\0");
    assert_eq!((negative.error, u64_at(&negative.body, 0)), (0, 0));
}

#[test]
fn a_file_is_created_written_read_and_removed_through_the_ring_s_answers() {
    let dir = tempfile::tempdir().unwrap();
    let d = door(dir.path(), Caching::Shared);
    let flags = (libc::O_CREAT | libc::O_EXCL | libc::O_RDWR) as u32;
    let made = ask(
        &d,
        CREATE,
        ROOT,
        &words(&[flags, 0o100640, 0o022, 0]),
        b"new\0",
    );
    assert_eq!(made.error, 0);
    assert_eq!(made.body.len(), 128 + 16, "fuse_entry_out, fuse_open_out");
    let nodeid = u64_at(&made.body, 0);
    assert_eq!(u32_at(&made.body, 40 + 60), libc::S_IFREG | 0o640);
    let fh = u64_at(&made.body, 128);
    assert_eq!(
        u32_at(&made.body, 140),
        0,
        "no backing file without passthrough"
    );

    let mut write_in = fh.to_ne_bytes().to_vec();
    write_in.extend_from_slice(&0u64.to_ne_bytes()); // offset
    write_in.extend_from_slice(&words(&[5, 0]));
    write_in.extend_from_slice(&[0; 16]);
    let written = ask(&d, WRITE, nodeid, &write_in, b"hello");
    assert_eq!((written.error, u32_at(&written.body, 0)), (0, 5));
    assert_eq!(std::fs::read(dir.path().join("new")).unwrap(), b"hello");

    let mut read_in = fh.to_ne_bytes().to_vec();
    read_in.extend_from_slice(&1u64.to_ne_bytes());
    read_in.extend_from_slice(&words(&[100, 0]));
    read_in.extend_from_slice(&[0; 16]);
    let read = ask(&d, READ, nodeid, &read_in, &[]);
    assert_eq!((read.error, read.body.as_slice()), (0, &b"ello"[..]));

    let none = ask(
        &d,
        GETXATTR,
        nodeid,
        &words(&[0, 0]),
        b"security.capability\0",
    );
    assert!(
        none.error == -libc::ENODATA || none.error == -libc::ENOSYS,
        "{}",
        none.error
    );
    let released = ask(
        &d,
        RELEASE,
        nodeid,
        &[fh.to_ne_bytes().as_slice(), &[0; 16]].concat(),
        &[],
    );
    assert_eq!((released.error, released.body.len()), (0, 0));
    let opened = ask(&d, OPEN, nodeid, &words(&[libc::O_RDONLY as u32, 0]), &[]);
    assert_eq!((opened.error, opened.body.len()), (0, 16));

    let gone = ask(&d, UNLINK, ROOT, &[], b"new\0");
    assert_eq!(gone.error, 0);
    assert!(!dir.path().join("new").exists());
    let again = ask(&d, UNLINK, ROOT, &[], b"new\0");
    assert_eq!(again.error, -libc::ENOENT);
}

#[test]
fn a_read_larger_than_the_door_lets_the_kernel_send_is_answered_at_that_size() {
    // A sparse file of 4 GiB: a READ of u32::MAX bytes must not make the
    // answer's buffer 4 GiB (the fuzz target's out-of-memory).
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("big")).unwrap();
    file.set_len(1 << 32).unwrap();
    let d = door(dir.path(), Caching::Shared);
    let found = ask(&d, LOOKUP, ROOT, &[], b"big\0");
    let nodeid = u64_at(&found.body, 0);
    for size in [
        u32::MAX,
        crate::limits::MAX_WRITE + 1,
        crate::limits::MAX_WRITE,
    ] {
        let read_in = ReadIn {
            offset: 4096,
            size,
            ..Default::default()
        };
        let read = ask(&d, READ, nodeid, read_in.as_bytes(), &[]);
        assert_eq!(read.error, 0);
        assert_eq!(
            read.body.len(),
            crate::limits::MAX_WRITE as usize,
            "asked {size}"
        );
        assert!(read.body.capacity() < 2 * crate::limits::MAX_WRITE as usize);
    }
}

#[test]
fn a_request_the_door_does_not_serve_is_enosys_and_a_malformed_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = door(dir.path(), Caching::Shared);
    const LSEEK: u32 = 46;
    const SETLK: u32 = 32;
    for opcode in [LSEEK, SETLK, 4096] {
        let got = ask(&d, opcode, ROOT, &[0; 24], &[]);
        assert_eq!((got.error, got.body.len()), (-libc::ENOSYS, 0), "{opcode}");
    }
    let unnamed = ask(&d, LOOKUP, ROOT, &[], b"no end");
    assert_eq!(unnamed.error, -libc::EINVAL);
    let empty = ask(&d, UNLINK, ROOT, &[], b"\0");
    assert_eq!(empty.error, -libc::EINVAL);
    let short = ask(&d, OPEN, ROOT, &[0; 4], &[]);
    assert_eq!((short.error, short.body.len()), (-libc::EIO, 0));
    let mkdir = MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    let short = ask(&d, MKDIR, ROOT, &mkdir.as_bytes()[..4], b"d\0");
    assert_eq!(short.error, -libc::EIO);
    assert!(!dir.path().join("d").exists(), "nothing done");
    let flush = ask(&d, FLUSH, ROOT, &[0; 24], &[]);
    assert_eq!(flush.error, -libc::ENOSYS, "said once, then never sent");
    let ioctl = ask(&d, IOCTL, ROOT, &[0; 32], &[]);
    assert_eq!(ioctl.error, -libc::ENOTTY);
}

/// The entry's node id, and its attributes' mode.
fn entry_of(got: &Answered) -> (u64, u32) {
    assert_eq!((got.error, got.body.len()), (0, 128), "fuse_entry_out");
    let out: abi::EntryOut = abi::args(&got.body).unwrap();
    (out.nodeid, out.attr.mode)
}

#[test]
fn names_are_made_linked_renamed_and_removed_through_the_ring_s_answers() {
    let dir = tempfile::tempdir().unwrap();
    let d = door(dir.path(), Caching::Shared);
    let at = |name: &str| dir.path().join(name);

    let mkdir = MkdirIn {
        mode: 0o750,
        umask: 0o022,
    };
    let (sub, mode) = entry_of(&ask(&d, MKDIR, ROOT, mkdir.as_bytes(), b"sub\0"));
    assert_eq!(mode, libc::S_IFDIR | 0o750);
    assert_eq!(at("sub").metadata().unwrap().mode() & 0o7777, 0o750);

    let fifo = MknodIn {
        mode: libc::S_IFIFO | 0o600,
        ..Default::default()
    };
    let (_, mode) = entry_of(&ask(&d, MKNOD, sub, fifo.as_bytes(), b"pipe\0"));
    assert_eq!(mode, libc::S_IFIFO | 0o600);
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &at("sub/pipe").metadata().unwrap().file_type()
    ));

    // A symlink's name and target both follow, each ended.
    let (link, mode) = entry_of(&ask(&d, SYMLINK, ROOT, &[], b"ln\0sub/pipe\0"));
    assert_eq!(mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        std::fs::read_link(at("ln")).unwrap().to_str(),
        Some("sub/pipe")
    );
    let target = ask(&d, READLINK, link, &[], &[]);
    assert_eq!(
        (target.error, target.body.as_slice()),
        (0, &b"sub/pipe"[..])
    );

    std::fs::write(at("f"), b"data").unwrap();
    let (f, _) = entry_of(&ask(&d, LOOKUP, ROOT, &[], b"f\0"));
    // LINK: the header names the new parent, the struct the file.
    let (linked, _) = entry_of(&ask(
        &d,
        LINK,
        sub,
        LinkIn { oldnodeid: f }.as_bytes(),
        b"g\0",
    ));
    assert_eq!(linked, f, "the same file");
    assert_eq!(std::fs::read(at("sub/g")).unwrap(), b"data");

    let rename = RenameIn { newdir: sub };
    let moved = ask(&d, RENAME, ROOT, rename.as_bytes(), b"f\0h\0");
    assert_eq!((moved.error, at("f").exists()), (0, false));
    assert_eq!(std::fs::read(at("sub/h")).unwrap(), b"data");
    // RENAME2 with a flag: refused, and nothing moves.
    let noreplace = Rename2In {
        newdir: ROOT,
        flags: libc::RENAME_NOREPLACE,
        padding: 0,
    };
    let refused = ask(&d, RENAME2, sub, noreplace.as_bytes(), b"h\0f\0");
    assert_eq!(refused.error, -libc::EINVAL);
    assert!(at("sub/h").exists() && !at("f").exists());
    let plain = Rename2In {
        newdir: ROOT,
        flags: 0,
        padding: 0,
    };
    assert_eq!(ask(&d, RENAME2, sub, plain.as_bytes(), b"h\0f\0").error, 0);
    assert_eq!(std::fs::read(at("f")).unwrap(), b"data");

    let busy = ask(&d, RMDIR, ROOT, &[], b"sub\0");
    assert_eq!(busy.error, -libc::ENOTEMPTY);
    for name in [&b"pipe\0"[..], b"g\0"] {
        assert_eq!(ask(&d, UNLINK, sub, &[], name).error, 0);
    }
    assert_eq!(ask(&d, RMDIR, ROOT, &[], b"sub\0").error, 0);
    assert!(!at("sub").exists());
}

/// The entries of a READDIR or READDIRPLUS answer: node, cookie, type and
/// name of each, read back from `struct fuse_dirent(plus)`.
fn entries(body: &[u8], plus: bool) -> Vec<(u64, u64, u32, Vec<u8>)> {
    let head = if plus {
        size_of::<DirentPlus>()
    } else {
        size_of::<Dirent>()
    };
    let mut at = 0;
    let mut found = Vec::new();
    while at < body.len() {
        let dirent: Dirent = match plus {
            true => abi::args::<DirentPlus>(&body[at..]).unwrap().dirent,
            false => abi::args(&body[at..]).unwrap(),
        };
        let name = &body[at + head..at + head + dirent.namelen as usize];
        found.push((dirent.ino, dirent.off, dirent.typ, name.to_vec()));
        let len = (head + name.len()).next_multiple_of(8);
        assert!(
            body[at + head + name.len()..at + len]
                .iter()
                .all(|&b| b == 0),
            "padded"
        );
        at += len;
    }
    assert_eq!(at, body.len(), "whole entries only");
    found
}

#[test]
fn a_listing_is_laid_out_as_fuse_dirents_and_resumes_from_its_last_cookie() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..50 {
        std::fs::write(dir.path().join(format!("file-{i:02}")), b"").unwrap();
    }
    std::fs::create_dir(dir.path().join("a-directory")).unwrap();
    let d = door(dir.path(), Caching::Shared);
    for (opcode, plus) in [(READDIR, false), (READDIRPLUS, true)] {
        let mut seen = Vec::new();
        let mut cookie = 0;
        let mut replies = 0;
        loop {
            // Room for a few entries at a time, as a small buffer asks.
            let read = ReadIn {
                offset: cookie,
                size: 400,
                ..Default::default()
            };
            let got = ask(&d, opcode, ROOT, read.as_bytes(), &[]);
            assert_eq!(got.error, 0);
            assert!(got.body.len() <= 400, "{} bytes", got.body.len());
            let page = entries(&got.body, plus);
            if page.is_empty() {
                break;
            }
            replies += 1;
            cookie = page.last().unwrap().1;
            seen.extend(page);
        }
        assert!(replies > 3, "{replies} replies");
        let mut names: Vec<_> = seen.iter().map(|e| e.3.clone()).collect();
        names.sort();
        let total = names.len();
        names.dedup();
        assert_eq!(names.len(), total, "each name once");
        assert_eq!(total, 53, "50 files, a directory and the dots");
        let (_, _, typ, _) = seen.iter().find(|e| e.3 == b"a-directory").unwrap();
        assert_eq!(*typ, libc::S_IFDIR >> 12);
        let (ino, _, typ, _) = seen.iter().find(|e| e.3 == b"file-07").unwrap();
        assert_eq!(*typ, libc::S_IFREG >> 12);
        let (looked_up, _) = entry_of(&ask(&d, LOOKUP, ROOT, &[], b"file-07\0"));
        assert_eq!(*ino, looked_up, "the node a lookup gives");
    }
    // An entry that does not fit is left for the next call, not cut.
    let tiny = ReadIn {
        size: 20,
        ..Default::default()
    };
    let got = ask(&d, READDIR, ROOT, tiny.as_bytes(), &[]);
    assert_eq!((got.error, got.body.len()), (0, 0));
}

#[test]
fn statfs_access_fsync_and_fallocate_are_answered_as_the_host_says() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"").unwrap();
    std::fs::set_permissions(
        dir.path().join("f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let d = door(dir.path(), Caching::Shared);

    let got = ask(&d, STATFS, ROOT, &[], &[]);
    assert_eq!((got.error, got.body.len()), (0, 80), "fuse_statfs_out");
    let out: abi::StatfsOut = abi::args(&got.body).unwrap();
    let host = rustix::fs::statvfs(dir.path()).unwrap();
    assert_eq!((out.bsize, out.frsize), (4096, 4096));
    assert_eq!(out.blocks, host.f_blocks * host.f_frsize / 4096);
    assert_eq!(out.files, host.f_files);
    assert_eq!(out.namelen, 255);

    let (f, _) = entry_of(&ask(&d, LOOKUP, ROOT, &[], b"f\0"));
    let access = |mask: i32, uid: u32| {
        let mut h = header(ACCESS, f);
        h.uid = uid;
        h.gid = uid;
        let arg = AccessIn {
            mask: mask as u32,
            padding: 0,
        };
        let mut out = Answered::default();
        answer(
            &d,
            &h,
            Request::parse(h.opcode, Body::split(arg.as_bytes(), &[], 0)),
            &mut out,
        );
        out.error
    };
    let owner = rustix::process::geteuid().as_raw();
    assert_eq!(access(libc::R_OK | libc::W_OK, owner), 0);
    if owner == 0 {
        // Root may not execute a file no one may execute.
        assert_eq!(access(libc::X_OK, 0), -libc::EACCES);
    }
    assert_eq!(access(libc::R_OK, owner + 1), -libc::EACCES, "another user");

    let open = OpenIn {
        flags: libc::O_RDWR as u32,
        open_flags: 0,
    };
    let opened = ask(&d, OPEN, f, open.as_bytes(), &[]);
    let fh = abi::args::<abi::OpenOut>(&opened.body).unwrap().fh;
    let grow = FallocateIn {
        fh,
        offset: 0,
        length: 8192,
        mode: 0,
        padding: 0,
    };
    assert_eq!(ask(&d, FALLOCATE, f, grow.as_bytes(), &[]).error, 0);
    assert_eq!(dir.path().join("f").metadata().unwrap().len(), 8192);
    let zero = FallocateIn {
        mode: libc::FALLOC_FL_ZERO_RANGE as u32,
        ..grow
    };
    assert_eq!(
        ask(&d, FALLOCATE, f, zero.as_bytes(), &[]).error,
        -libc::EOPNOTSUPP
    );
    for fsync_flags in [0, FSYNC_FDATASYNC] {
        let fsync = FsyncIn {
            fh,
            fsync_flags,
            padding: 0,
        };
        assert_eq!(ask(&d, FSYNC, f, fsync.as_bytes(), &[]).error, 0);
        assert_eq!(ask(&d, FSYNCDIR, ROOT, fsync.as_bytes(), &[]).error, 0);
    }
    let dir_open = ask(&d, OPENDIR, ROOT, open.as_bytes(), &[]);
    assert_eq!((dir_open.error, dir_open.body.len()), (0, 16));
    assert_eq!(ask(&d, RELEASEDIR, ROOT, &[0; 24], &[]).error, 0);
}

#[test]
fn extended_attributes_are_set_read_listed_and_removed_through_the_ring_s_answers() {
    let (lower, upper) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(lower.path().join("f"), b"x").unwrap();
    let stack = layerfs_layers::StackFs::open_in_upper(&[lower.path().to_owned()], upper.path());
    let d = Door::new(Arc::new(stack.unwrap()), Caching::Exclusive);
    let (f, _) = entry_of(&ask(&d, LOOKUP, ROOT, &[], b"f\0"));
    let set = |flags: i32, value: &[u8]| {
        let arg = SetxattrIn {
            size: value.len() as u32,
            flags: flags as u32,
        };
        ask(
            &d,
            SETXATTR,
            f,
            arg.as_bytes(),
            &[b"user.k\0", value].concat(),
        )
        .error
    };
    assert_eq!(set(libc::XATTR_REPLACE, b"v"), -libc::ENODATA);
    assert_eq!(set(libc::XATTR_CREATE, b"value"), 0);
    assert_eq!(set(libc::XATTR_CREATE, b"v"), -libc::EEXIST);
    // A value shorter than the struct says is refused.
    let long = SetxattrIn { size: 99, flags: 0 };
    let cut = ask(&d, SETXATTR, f, long.as_bytes(), b"user.k\0v");
    assert_eq!(cut.error, -libc::EIO);

    let get = |size: u32| {
        ask(
            &d,
            GETXATTR,
            f,
            GetxattrIn { size, padding: 0 }.as_bytes(),
            b"user.k\0",
        )
    };
    let size = get(0);
    assert_eq!(
        (
            size.error,
            abi::args::<abi::GetxattrOut>(&size.body).unwrap().size
        ),
        (0, 5)
    );
    assert_eq!(get(64).body, b"value");
    assert_eq!(get(2).error, -libc::ERANGE);
    let list = ask(
        &d,
        LISTXATTR,
        f,
        GetxattrIn {
            size: 4096,
            padding: 0,
        }
        .as_bytes(),
        &[],
    );
    assert!(
        list.body.split(|&b| b == 0).any(|n| n == b"user.k"),
        "{:?}",
        list.body
    );
    assert_eq!(ask(&d, REMOVEXATTR, f, &[], b"user.k\0").error, 0);
    assert_eq!(get(64).error, -libc::ENODATA);
}
