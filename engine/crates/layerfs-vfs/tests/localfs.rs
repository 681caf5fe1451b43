//! LocalFs directly, without NFS in between.

use std::collections::BTreeSet;
use std::time::Duration;

use layerfs_vfs::{Caller, Create, Error, Filesystem, HostFiles, LocalFs, SetAttr, Stability};

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
                out.insert(String::from_utf8(e.name.to_vec()).unwrap()),
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
    let a = page
        .entries
        .iter()
        .find(|e| e.name[..] == b"a"[..])
        .unwrap();
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

/// Every entry's listed attributes against getattr's, page by page.
fn assert_listing_current(fs: &LocalFs, dir: layerfs_vfs::FileId, after: &str) {
    let mut cookie = 0;
    let mut seen = 0;
    loop {
        let page = fs.readdir(&Caller::root(), dir, cookie, 5, true).unwrap();
        for e in &page.entries {
            cookie = e.cookie;
            if e.name[..] == b"."[..] || e.name[..] == b".."[..] {
                continue;
            }
            let listed = e.attr.expect("attributes listed");
            let now = fs.getattr(e.fileid).unwrap();
            assert_eq!(
                listed,
                now,
                "{} after {after}",
                String::from_utf8_lossy(&e.name)
            );
            seen += 1;
        }
        if page.eof {
            break;
        }
    }
    assert!(seen > 0, "nothing listed after {after}");
}

/// Listed attributes are kept between listings (the directory is watched):
/// whoever changes a file, through layerfs or on the host, the next listing
/// shows it.
#[test]
fn a_listing_shows_each_files_attributes_as_they_are_after_every_change() {
    use layerfs_vfs::Stability;
    use std::os::unix::fs::PermissionsExt;

    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    std::fs::create_dir_all(tmp.path().join("other")).unwrap();
    std::fs::create_dir(&d).unwrap();
    for name in ["a", "b", "c", "e", "g", "h"] {
        std::fs::write(d.join(name), b"12345").unwrap();
    }
    std::fs::hard_link(d.join("h"), tmp.path().join("other/h")).unwrap();
    let fs = LocalFs::open(tmp.path()).unwrap();
    let who = Caller::root();
    let at = |dir, name: &str| fs.lookup(&who, dir, name.as_bytes()).unwrap().fileid;
    let dir = at(fs.root(), "d");
    let settle = || std::thread::sleep(Duration::from_millis(120));
    settle();
    assert_listing_current(&fs, dir, "opening");
    assert_listing_current(&fs, dir, "listing again");

    // Through layerfs: a write, the NFS door's write to the host descriptor,
    // a setattr.
    let a = at(dir, "a");
    fs.write(&who, a, 0, b"longer than before", Stability::FileSync)
        .unwrap();
    assert_listing_current(&fs, dir, "a write");
    let host = fs.host_file(&who, a, true).unwrap().expect("a host file");
    rustix::io::pwrite(&*host, b"x", 100).unwrap();
    assert_listing_current(&fs, dir, "a write to a's host file");
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(&who, at(dir, "b"), &chmod, None).unwrap();
    assert_listing_current(&fs, dir, "a chmod");

    // On the host, behind layerfs' back.
    std::fs::write(d.join("c"), b"rewritten on the host").unwrap();
    assert_listing_current(&fs, dir, "a write on the host");
    std::fs::set_permissions(d.join("e"), std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_listing_current(&fs, dir, "a chmod on the host");
    // A file with a second name elsewhere, written through that one.
    std::fs::write(tmp.path().join("other/h"), b"through the other name").unwrap();
    assert_listing_current(&fs, dir, "a write through a hard link elsewhere");
    // A name that layerfs links elsewhere, then written through the new name.
    let g = at(dir, "g");
    fs.link(&who, g, at(fs.root(), "other"), b"g").unwrap();
    std::fs::write(tmp.path().join("other/g"), b"through the new name").unwrap();
    assert_listing_current(&fs, dir, "a link by layerfs and a write through it");
    // A name replaced on the host.
    std::fs::remove_file(d.join("e")).unwrap();
    std::fs::write(d.join("e"), b"another file").unwrap();
    settle();
    assert_listing_current(&fs, dir, "a name replaced on the host");
    std::fs::write(d.join("e"), b"and written").unwrap();
    assert_listing_current(&fs, dir, "a write to the new file");

    // A file layerfs opened through a name in another directory, linked
    // here, that name then removed: its writes go through this one.
    let other = at(fs.root(), "other");
    let (made, _) = fs
        .create(&who, other, b"y", Create::Unchecked(SetAttr::default()))
        .unwrap();
    fs.write(&who, made.fileid, 0, b"1", Stability::FileSync)
        .unwrap();
    fs.link(&who, made.fileid, dir, b"y").unwrap();
    fs.remove(&who, other, b"y").unwrap();
    settle();
    assert_listing_current(&fs, dir, "a link and the other name's removal");
    fs.write(&who, made.fileid, 0, b"longer now", Stability::FileSync)
        .unwrap();
    assert_listing_current(&fs, dir, "a write to the file left with one name");
}

/// What a change costs in host attribute reads where its directory is open
/// already: checking the handle's generation none, the directory once
/// before the change and once after it, whatever the change.
#[test]
fn a_change_in_an_open_directory_reads_its_attributes_once_before_and_once_after() {
    use layerfs_vfs::hostdir::stat_reads_during as reads;
    let tmp = tempfile::tempdir().unwrap();
    let fs = LocalFs::open(tmp.path()).unwrap();
    let me = Caller::root();
    let (d, _) = fs.mkdir(&me, fs.root(), b"d", &SetAttr::default()).unwrap();
    let new = || Create::Guarded(SetAttr::default());
    // The first change in it opens it.
    fs.create(&me, d.fileid, b"first", new()).unwrap();
    let root = fs.getattr(fs.root()).unwrap();
    assert_eq!(
        reads(|| fs.still_names(root.fileid, root.generation).unwrap()),
        0
    );
    assert_eq!(reads(|| fs.still_names(d.fileid, d.generation).unwrap()), 0);
    let stale = || {
        assert_eq!(
            fs.still_names(d.fileid, d.generation ^ 1),
            Err(Error::Stale)
        )
    };
    assert_eq!(reads(stale), 0);
    // The new file's own attributes are the third.
    let create = || {
        fs.create(&me, d.fileid, b"a", new()).unwrap();
    };
    assert_eq!(reads(create), 3);
    // The file CREATE made stays open for the writes that follow: a WRITE
    // reads its attributes before and after, and opens nothing.
    let a = fs.lookup(&me, d.fileid, b"a").unwrap();
    assert_eq!(reads(|| fs.still_names(a.fileid, a.generation).unwrap()), 0);
    let write = || {
        fs.write(&me, a.fileid, 0, b"data", Stability::Unstable)
            .unwrap();
    };
    assert_eq!(reads(write), 2);
    // The name that goes is looked at; a new name the rename takes is not:
    // the host is asked to replace nothing.
    let rename = || {
        fs.rename(&me, d.fileid, b"a", d.fileid, b"b").unwrap();
    };
    assert_eq!(reads(rename), 3);
    // A name that is there is, for the sticky bit and its links.
    fs.create(&me, d.fileid, b"c", new()).unwrap();
    let replace = || {
        fs.rename(&me, d.fileid, b"c", d.fileid, b"b").unwrap();
    };
    assert_eq!(reads(replace), 4);
    assert_eq!(fs.lookup(&me, d.fileid, b"c"), Err(Error::NoEnt));
    // The name removed is looked at, for the sticky bit and its links.
    let remove = || {
        fs.remove(&me, d.fileid, b"b").unwrap();
    };
    assert_eq!(reads(remove), 3);
    // Once it is gone, its handle is stale.
    fs.remove(&me, d.fileid, b"first").unwrap();
    fs.rmdir(&me, fs.root(), b"d").unwrap();
    assert_eq!(fs.still_names(d.fileid, d.generation), Err(Error::Stale));
}

#[global_allocator]
static ALLOC: layerfs_testkit::LargestPerThread = layerfs_testkit::LargestPerThread;

/// The calls a client repeats most, on files already known, allocate
/// nothing: where a file was seen is handed out without copying its name,
/// and a name looked up again is not recorded again.
#[test]
fn a_getattr_or_a_lookup_again_of_a_known_file_allocates_nothing() {
    use layerfs_testkit::allocations_while as allocations;
    let tmp = tempfile::tempdir().unwrap();
    let fs = LocalFs::open(tmp.path()).unwrap();
    let me = Caller::root();
    let (d, _) = fs.mkdir(&me, fs.root(), b"d", &SetAttr::default()).unwrap();
    std::fs::write(tmp.path().join("d/f"), b"x").unwrap();
    let f = fs.lookup(&me, d.fileid, b"f").unwrap();
    fs.getattr(f.fileid).unwrap();
    assert_eq!(
        allocations(|| {
            fs.getattr(f.fileid).unwrap();
        }),
        0
    );
    assert_eq!(
        allocations(|| {
            fs.lookup(&me, d.fileid, b"f").unwrap();
        }),
        0
    );
}

/// A directory in use stays open however many others are opened after
/// it: past the room for them, the one used least recently is closed, so
/// checking its handle still asks the host nothing.
#[test]
fn a_directory_in_use_stays_open_past_the_room_for_open_directories() {
    use layerfs_vfs::hostdir::stat_reads_during as reads;
    let tmp = tempfile::tempdir().unwrap();
    let fs = LocalFs::open(tmp.path()).unwrap();
    let me = Caller::root();
    let new = || Create::Guarded(SetAttr::default());
    let (d, _) = fs.mkdir(&me, fs.root(), b"d", &SetAttr::default()).unwrap();
    fs.create(&me, d.fileid, b"f", new()).unwrap();
    // Well past the 512 directories kept open.
    for i in 0..700 {
        let name = format!("e{i}");
        let (e, _) = fs
            .mkdir(&me, fs.root(), name.as_bytes(), &SetAttr::default())
            .unwrap();
        fs.create(&me, e.fileid, b"f", new()).unwrap();
        assert_eq!(
            reads(|| fs.still_names(d.fileid, d.generation).unwrap()),
            0,
            "d closed after {i} other directories"
        );
        fs.getattr(d.fileid).unwrap();
    }
}

/// A file kept open is still the file its handle names: removed on the
/// host, its writes and commits are `Stale`, not written to a file no name
/// leads to, and its handle stays stale when the name is made again.
#[test]
fn a_file_removed_on_the_host_while_open_here_is_stale() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = LocalFs::open(tmp.path()).unwrap();
    let me = Caller::root();
    let new = || Create::Guarded(SetAttr::default());
    let (f, _) = fs.create(&me, fs.root(), b"f", new()).unwrap();
    fs.write(&me, f.fileid, 0, b"kept", Stability::Unstable)
        .unwrap();
    std::fs::remove_file(tmp.path().join("f")).unwrap();
    let write = fs.write(&me, f.fileid, 0, b"lost", Stability::Unstable);
    assert_eq!(write.err(), Some(Error::Stale));
    assert_eq!(fs.commit(f.fileid).err(), Some(Error::Stale));
    assert_eq!(fs.still_names(f.fileid, f.generation), Err(Error::Stale));
    // Made again on the host under the same name: the old handle still
    // names nothing, unless the new file has its inode number and the
    // host keeps no birth time to tell them apart (generation 0).
    std::fs::write(tmp.path().join("f"), b"new").unwrap();
    let now = fs.lookup(&me, fs.root(), b"f").unwrap();
    if (now.fileid, now.generation) != (f.fileid, f.generation) {
        assert_eq!(fs.still_names(f.fileid, f.generation), Err(Error::Stale));
    }
}

/// fsync(2) of a directory (what the FUSE door asks for a directory's
/// descriptor) makes its entries durable, as on a local filesystem: it is
/// no `IsDir` error.
#[test]
fn a_directory_is_committed_like_a_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let fs = LocalFs::open(dir.path()).unwrap();
    let sub = fs.lookup(&Caller::root(), fs.root(), b"sub").unwrap();
    for id in [fs.root(), sub.fileid] {
        let done = fs.commit(id).unwrap();
        assert_eq!(done.after.map(|a| a.fileid), Some(id));
    }
}
