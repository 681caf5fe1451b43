//! Ids on host filesystems that do not keep inode numbers: an overlay whose
//! layers are on two filesystems renumbers a directory each time its cache
//! entry is evicted, and numbers other files per layer filesystem. Ids must
//! neither collide nor go stale there, within a run and across a restart.

use std::collections::{BTreeMap, HashSet};

use layerfs_testkit::{drop_caches, or_skip, CrossOverlay, Mounted};
use layerfs_vfs::hostdir::Stats;
use layerfs_vfs::{Caller, Create, Error, FileId, FileKind, Filesystem, LocalFs, SetAttr};

const FILES: usize = 300;
const DIRS: usize = 20;

fn root() -> Caller {
    Caller::root()
}

fn unchecked() -> Create {
    Create::Unchecked(SetAttr::default())
}

/// Every entry of `dir` (but `.` and `..`): name → (id, kind), checking that
/// each listed id is the id its attributes give.
fn listing(fs: &LocalFs, dir: FileId) -> BTreeMap<Vec<u8>, (FileId, FileKind)> {
    let mut out = BTreeMap::new();
    let mut cookie = 0;
    loop {
        let page = fs.readdir(&root(), dir, cookie, 64, true).unwrap();
        for e in &page.entries {
            cookie = e.cookie;
            if e.name[..] == b"."[..] || e.name[..] == b".."[..] {
                continue;
            }
            let attr = e.attr.expect("attributes listed");
            assert_eq!(
                attr.fileid,
                e.fileid,
                "{:?}",
                String::from_utf8_lossy(&e.name)
            );
            out.insert(e.name.to_vec(), (e.fileid, attr.kind));
        }
        if page.eof {
            return out;
        }
    }
}

#[test]
fn ids_neither_collide_nor_go_stale_on_an_overlay_across_filesystems() {
    // The lower holds a directory `old` with a file.
    let ov = CrossOverlay::new(|lower| {
        std::fs::create_dir(lower.join("old")).unwrap();
        std::fs::write(lower.join("old/kept"), b"kept").unwrap();
    });
    let Some(ov) = or_skip(ov, "overlay across filesystems") else {
        return;
    };
    let merged = ov.merged();
    let root_dir = std::fs::File::open(&merged).unwrap();
    assert!(
        !Stats::for_export(std::os::fd::AsFd::as_fd(&root_dir)).keeps_inode_numbers(),
        "an overlay across filesystems was taken for one that keeps inode numbers"
    );
    let fs = LocalFs::open(&merged).unwrap();
    let top = fs.root();
    let d = fs
        .mkdir(&root(), top, b"d", &SetAttr::default())
        .unwrap()
        .0
        .fileid;
    for i in 0..FILES {
        let name = format!("file-with-a-longish-name-{i}");
        fs.create(&root(), d, name.as_bytes(), unchecked()).unwrap();
    }
    for i in 0..DIRS {
        let name = format!("sub-{i}");
        fs.mkdir(&root(), d, name.as_bytes(), &SetAttr::default())
            .unwrap();
    }
    let before = listing(&fs, d);
    assert_eq!(before.len(), FILES + DIRS);
    let mut ids: HashSet<FileId> = before.values().map(|v| v.0).collect();
    ids.extend([top, d, fs.lookup(&root(), top, b"old").unwrap().fileid]);
    assert_eq!(ids.len(), FILES + DIRS + 3, "two files share an id");

    // Evicted from the kernel's caches, directories come back renumbered.
    drop_caches().unwrap();
    assert_eq!(fs.lookup(&root(), top, b"d").unwrap().fileid, d);
    for (name, (id, kind)) in &before {
        assert_eq!(
            fs.getattr(*id).map(|a| (a.fileid, a.kind)),
            Ok((*id, *kind))
        );
        assert_eq!(fs.lookup(&root(), d, name).unwrap().fileid, *id);
    }
    let old = fs.lookup(&root(), top, b"old").unwrap().fileid;
    drop(fs);

    // A restart: every handle handed out before still names its file.
    drop_caches().unwrap();
    let fs = LocalFs::open(&merged).unwrap();
    assert_eq!(fs.root(), top);
    assert_eq!(fs.getattr(d).unwrap().kind, FileKind::Directory);
    assert_eq!(fs.getattr(old).unwrap().kind, FileKind::Directory);
    for (id, kind) in before.values() {
        assert_eq!(fs.getattr(*id).map(|a| a.kind), Ok(*kind));
    }
    // rm -rf, with the caches dropped half way.
    for (i, (name, (id, kind))) in before.iter().enumerate() {
        if i == FILES / 2 {
            drop_caches().unwrap();
        }
        match kind {
            FileKind::Directory => fs.rmdir(&root(), d, name).unwrap(),
            _ => fs.remove(&root(), d, name).unwrap(),
        };
        assert_eq!(fs.getattr(*id), Err(Error::Stale));
    }
    fs.rmdir(&root(), top, b"d").unwrap();
    assert_eq!(std::fs::read_dir(&merged).unwrap().count(), 1);
}

#[test]
fn an_overlay_on_one_filesystem_keeps_inode_numbers() {
    let t = tempfile::tempdir().unwrap();
    let d = |n: &str| {
        let p = t.path().join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let (lower, up, work, merged) = (d("l"), d("u"), d("w"), d("m"));
    let Some(_ov) = or_skip(
        Mounted::overlay(&[lower], &up, &work, &merged, ""),
        "overlay on one filesystem",
    ) else {
        return;
    };
    let fd = std::fs::File::open(&merged).unwrap();
    assert!(Stats::for_export(std::os::fd::AsFd::as_fd(&fd)).keeps_inode_numbers());
    let plain = std::fs::File::open(t.path()).unwrap();
    assert!(Stats::for_export(std::os::fd::AsFd::as_fd(&plain)).keeps_inode_numbers());
}

#[test]
fn a_hard_linked_file_keeps_its_id_while_it_has_a_name() {
    let t = tempfile::tempdir().unwrap();
    let fs = LocalFs::open(t.path()).unwrap();
    let top = fs.root();
    let a = fs.create(&root(), top, b"a", unchecked()).unwrap().0.fileid;
    fs.write(&root(), a, 0, b"data", layerfs_vfs::Stability::Unstable)
        .unwrap();
    fs.link(&root(), a, top, b"b").unwrap();
    fs.link(&root(), a, top, b"c").unwrap();
    fs.create(&root(), top, b"other", unchecked()).unwrap();
    // The name the table kept goes: the file is found by another.
    fs.remove(&root(), top, b"a").unwrap();
    assert_eq!(fs.getattr(a).map(|x| x.nlink), Ok(2));
    let mut buf = Vec::new();
    fs.read(&root(), a, 0, 10, &mut buf).unwrap();
    assert_eq!(buf, b"data");
    // Replaced by a rename: still one name left.
    fs.rename(&root(), top, b"other", top, b"b").unwrap();
    assert_eq!(fs.getattr(a).map(|x| x.nlink), Ok(1));
    fs.remove(&root(), top, b"c").unwrap();
    assert_eq!(fs.getattr(a), Err(Error::Stale));
}

/// A filesystem mounted inside the export (as a btrfs subvolume is, too)
/// numbers its inodes apart: a file there may have the number of a file of
/// the export. Its files are refused, never taken for the export's, also by
/// the walk that finds a file again after a restart.
#[test]
fn a_filesystem_mounted_inside_the_export_is_refused_not_mixed_up() {
    use std::os::unix::fs::MetadataExt;
    let t = tempfile::tempdir().unwrap();
    let outer = t.path().join("export");
    std::fs::create_dir(&outer).unwrap();
    let Some(_export) = or_skip(Mounted::tmpfs(&outer, "4m"), "tmpfs export") else {
        return;
    };
    std::fs::create_dir_all(outer.join("m")).unwrap();
    std::fs::create_dir_all(outer.join("z/y")).unwrap();
    std::fs::write(outer.join("z/y/a"), b"the export's").unwrap();
    let ino = std::fs::metadata(outer.join("z/y/a")).unwrap().ino();
    let Some(_inner) = or_skip(Mounted::tmpfs(&outer.join("m"), "4m"), "tmpfs inside") else {
        return;
    };
    // A file one level nearer the root with the same inode number, where
    // the kernel numbers a fresh tmpfs as it did the export's.
    let mut collides = false;
    for i in 0..64 {
        let p = outer.join(format!("m/f{i}"));
        std::fs::write(&p, b"the mount's").unwrap();
        if std::fs::metadata(&p).unwrap().ino() == ino {
            collides = true;
            break;
        }
    }
    let fs = LocalFs::open(&outer).unwrap();
    let top = fs.root();
    assert_eq!(
        fs.lookup(&root(), top, b"m").map(|a| a.fileid),
        Err(Error::XDev)
    );
    let page = fs.readdir(&root(), top, 0, 64, true).unwrap();
    let m = page.entries.iter().find(|e| &e.name[..] == b"m");
    assert!(
        m.is_some_and(|e| e.attr.is_none()),
        "listed, without attributes"
    );
    let z = fs.lookup(&root(), top, b"z").unwrap().fileid;
    let y = fs.lookup(&root(), z, b"y").unwrap().fileid;
    let a = fs.lookup(&root(), y, b"a").unwrap();
    assert_eq!(a.fileid, ino);
    // Restarted: the id is found again by walking the tree from the root.
    let fs = LocalFs::open(&outer).unwrap();
    let mut buf = Vec::new();
    fs.read(&root(), a.fileid, 0, 64, &mut buf).unwrap();
    assert_eq!(
        buf, b"the export's",
        "a file numbered alike elsewhere: {collides}"
    );
    assert_eq!(fs.getattr(a.fileid).map(|x| x.size), Ok(12));
}
