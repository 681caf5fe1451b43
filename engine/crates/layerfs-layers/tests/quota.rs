//! A size limit on a workspace's upper: a change past it fails with NOSPC
//! before it starts, removals free room at once, a copy-up never half
//! happens.

use layerfs_layers::{StackFs, ENTRY_CHARGE};
use layerfs_vfs::{Caller, Create, Error, FileId, Filesystem, HostFiles, SetAttr, Stability};

const ROOT: FileId = 1;
const KIB: u64 = 1024;

fn create(fs: &StackFs, name: &str) -> Result<FileId, Error> {
    let made = fs.create(
        &Caller::root(),
        ROOT,
        name.as_bytes(),
        Create::Unchecked(SetAttr::default()),
    );
    made.map(|(a, _)| a.fileid)
}

fn write(fs: &StackFs, id: FileId, offset: u64, len: u64) -> Result<(), Error> {
    let data = vec![7u8; len as usize];
    fs.write(&Caller::root(), id, offset, &data, Stability::Unstable)
        .map(drop)
}

#[test]
fn writes_past_the_limit_fail_and_room_freed_is_found_again() {
    let t = tempfile::tempdir().unwrap();
    let lower = t.path().join("lower");
    std::fs::create_dir(&lower).unwrap();
    std::fs::write(lower.join("big"), vec![1u8; 100 * 1024]).unwrap();
    std::fs::write(lower.join("small"), vec![1u8; 1024]).unwrap();
    let upper = t.path().join("upper");
    let fs = StackFs::open(&[lower], &upper, &t.path().join("state")).unwrap();
    fs.set_size_limit(Some(64 * KIB)).unwrap();
    assert_eq!(fs.size_used().unwrap(), (0, Some(64 * KIB)));

    let a = create(&fs, "a").unwrap();
    write(&fs, a, 0, 40 * KIB).unwrap();
    assert_eq!(write(&fs, a, 40 * KIB, 40 * KIB), Err(Error::NoSpc));
    assert_eq!(
        fs.getattr(a).unwrap().size,
        40 * KIB,
        "the failed write wrote nothing"
    );
    // Within the limit still: an overwrite, a read, a small copy-up.
    write(&fs, a, 0, 40 * KIB).unwrap();
    let small = fs.lookup(&Caller::root(), ROOT, b"small").unwrap().fileid;
    write(&fs, small, 0, 10).unwrap();
    // A copy-up that would pass the limit does not start.
    let big = fs.lookup(&Caller::root(), ROOT, b"big").unwrap().fileid;
    assert_eq!(write(&fs, big, 0, 1), Err(Error::NoSpc));
    assert!(!upper.join("big").exists(), "half a copy-up in the upper");
    // Passthrough would write behind the count: not offered under a limit.
    assert!(fs.host_file(&Caller::root(), a, true).unwrap().is_none());

    // A removal frees its room for the very next write.
    fs.remove(&Caller::root(), ROOT, b"a").unwrap();
    let b = create(&fs, "b").unwrap();
    write(&fs, b, 0, 50 * KIB).unwrap();
    // So does a truncate.
    assert_eq!(write(&fs, b, 50 * KIB, 20 * KIB), Err(Error::NoSpc));
    let truncate = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    fs.setattr(&Caller::root(), b, &truncate, None).unwrap();
    write(&fs, b, 0, 50 * KIB).unwrap();
    let (used, _) = fs.size_used().unwrap();
    assert_eq!(
        used,
        50 * KIB + 1024 + 2 * ENTRY_CHARGE,
        "b and the copied-up small"
    );

    // Lifted, the limit stops nothing.
    fs.set_size_limit(None).unwrap();
    write(&fs, big, 0, 1).unwrap();
    assert!(fs.host_file(&Caller::root(), b, true).unwrap().is_some());
}
