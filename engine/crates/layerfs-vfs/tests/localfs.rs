//! LocalFs directly, without NFS in between.

use std::collections::BTreeSet;
use std::time::Duration;

use layerfs_vfs::{Caller, Create, Filesystem, LocalFs, SetAttr};

fn names(fs: &LocalFs, page_size: usize) -> BTreeSet<String> {
    let root = fs.root();
    let mut out = BTreeSet::new();
    let mut cookie = 0;
    loop {
        let page = fs
            .readdir(&Caller::root(), root, cookie, page_size, false)
            .unwrap();
        for e in &page.entries {
            assert!(
                out.insert(String::from_utf8(e.name.clone()).unwrap()),
                "listed twice"
            );
            cookie = e.cookie;
        }
        if page.eof {
            return out;
        }
    }
}

#[test]
fn a_listing_sees_every_change_made_since_even_within_one_clock_tick() {
    let dir = tempfile::tempdir().unwrap();
    let fs = LocalFs::open(dir.path()).unwrap();
    let root = fs.root();
    let create = |name: &str| {
        fs.create(
            &Caller::root(),
            root,
            name.as_bytes(),
            Create::Unchecked(SetAttr::default()),
        )
        .unwrap();
    };
    for i in 0..50 {
        create(&format!("f{i}"));
        // Listed right after each change: no stale listing may be served.
        assert_eq!(names(&fs, 7).len(), 2 + i + 1);
    }
    // Once the directory has settled its listing is kept; a change still shows.
    std::thread::sleep(Duration::from_millis(120));
    assert_eq!(names(&fs, 1000).len(), 52);
    create("late");
    assert!(names(&fs, 1000).contains("late"));
    std::fs::write(dir.path().join("outside"), b"").unwrap();
    assert!(
        names(&fs, 3).contains("outside"),
        "a change made on the host is seen too"
    );
    fs.remove(&Caller::root(), root, b"f3").unwrap();
    assert!(!names(&fs, 1000).contains("f3"));
}

#[test]
fn readdir_with_attributes_reports_each_entry() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), b"12345").unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    let fs = LocalFs::open(dir.path()).unwrap();
    let page = fs
        .readdir(&Caller::root(), fs.root(), 0, 100, true)
        .unwrap();
    assert!(page.eof);
    let a = page.entries.iter().find(|e| e.name == b"a").unwrap();
    assert_eq!(a.attr.unwrap().size, 5);
    assert_eq!(a.attr.unwrap().fileid, a.fileid);
    assert!(page.entries.iter().all(|e| e.attr.is_some()));
}

#[test]
fn reads_stop_at_the_end_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
    let fs = LocalFs::open(dir.path()).unwrap();
    let id = fs.lookup(&Caller::root(), fs.root(), b"f").unwrap().fileid;
    let mut buf = b"head".to_vec();
    let (eof, _) = fs.read(&Caller::root(), id, 4, 100, &mut buf).unwrap();
    assert!(eof);
    assert_eq!(buf, b"head456789");
    let mut buf = Vec::new();
    let (eof, _) = fs.read(&Caller::root(), id, 0, 3, &mut buf).unwrap();
    assert!(!eof);
    assert_eq!(buf, b"012");
    let mut buf = Vec::new();
    let (eof, _) = fs.read(&Caller::root(), id, 50, 3, &mut buf).unwrap();
    assert!(eof && buf.is_empty());
}
