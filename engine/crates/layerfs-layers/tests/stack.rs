//! The layered filesystem's rules, one at a time, through the Filesystem trait.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use layerfs_layers::{StackFs, STATE_IN_UPPER};
use layerfs_testkit::{largest_allocation_while, or_skip, CrossOverlay, LargestPerThread, Mounted};
use layerfs_vfs::{
    Allocate, Caller, Create, Error, FileId, FileKind, Filesystem, Hints, HostFiles, SetAttr,
    SetTime, Stability, Timestamp,
};

fn root() -> Caller {
    Caller::root()
}

struct Stack {
    t: tempfile::TempDir,
    lowers: Vec<PathBuf>,
}

impl Stack {
    /// Layers built by `build(i, dir)`, bottom first.
    fn new(n: usize, build: impl Fn(usize, &Path)) -> Stack {
        let t = tempfile::tempdir().unwrap();
        let lowers = (0..n)
            .map(|i| {
                let p = t.path().join(format!("l{i}"));
                std::fs::create_dir(&p).unwrap();
                build(i, &p);
                p
            })
            .collect();
        Stack { t, lowers }
    }

    fn upper(&self) -> PathBuf {
        self.t.path().join("upper")
    }

    fn open(&self) -> StackFs {
        StackFs::open_in_upper(&self.lowers, &self.upper()).unwrap()
    }
}

fn at(fs: &StackFs, path: &str) -> Result<FileId, Error> {
    let mut id = fs.root();
    for name in path.split('/') {
        id = fs.lookup(&root(), id, name.as_bytes())?.fileid;
    }
    Ok(id)
}

fn names(fs: &StackFs, dir: FileId) -> Vec<String> {
    let page = fs.readdir(&root(), dir, 0, 1000, false).unwrap();
    let mut out: Vec<_> = page
        .entries
        .iter()
        .filter(|e| e.cookie > 2)
        .map(|e| String::from_utf8(e.name.to_vec()).unwrap())
        .collect();
    out.sort();
    out
}

fn read_all(fs: &StackFs, id: FileId) -> Vec<u8> {
    let mut out = Vec::new();
    fs.read(&root(), id, 0, 1 << 20, &mut out).unwrap();
    out
}

#[test]
fn whiteouts_and_markers_are_never_seen_nor_made() {
    let s = Stack::new(2, |i, d| {
        if i == 0 {
            std::fs::write(d.join("gone"), b"x").unwrap();
            std::fs::create_dir(d.join("dir")).unwrap();
            std::fs::write(d.join("dir/below"), b"x").unwrap();
        } else {
            std::fs::write(d.join(".wh.gone"), b"").unwrap();
            std::fs::create_dir(d.join("dir")).unwrap();
            std::fs::write(d.join("dir/.wh..wh..opq"), b"").unwrap();
            std::fs::write(d.join("dir/above"), b"x").unwrap();
        }
    });
    let fs = s.open();
    assert_eq!(
        names(&fs, fs.root()),
        ["dir"],
        "whiteouts or the state directory showed"
    );
    assert_eq!(
        names(&fs, at(&fs, "dir").unwrap()),
        ["above"],
        "opaque did not hide"
    );
    assert_eq!(at(&fs, ".wh.gone"), Err(Error::NoEnt));
    assert_eq!(at(&fs, STATE_IN_UPPER), Err(Error::NoEnt));
    let r = fs.root();
    let new = Create::Guarded(SetAttr::default());
    assert_eq!(
        fs.create(&root(), r, b".wh.dir", new).err(),
        Some(Error::Inval)
    );
    assert_eq!(
        fs.mkdir(&root(), r, b".wh..wh..opq", &SetAttr::default())
            .err(),
        Some(Error::Inval)
    );
    assert_eq!(fs.remove(&root(), r, b".wh.gone").err(), Some(Error::NoEnt));
}

#[test]
fn copy_up_keeps_data_mode_owner_times_link_targets_and_the_id() {
    let s = Stack::new(1, |_, d| {
        std::fs::write(d.join("f"), b"lower data").unwrap();
        std::fs::set_permissions(d.join("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::symlink("target/path", d.join("link")).unwrap();
    });
    let lower = s.lowers[0].join("f");
    std::os::unix::fs::chown(&lower, Some(1234), Some(5678)).ok();
    let fs = s.open();
    let f = at(&fs, "f").unwrap();
    let before = fs.getattr(f).unwrap();
    fs.write(&root(), f, 5, b"DATA", Stability::Unstable)
        .unwrap();
    let after = fs.getattr(f).unwrap();
    assert_eq!(
        (after.fileid, after.generation),
        (before.fileid, before.generation)
    );
    assert_eq!(after.mode, 0o640);
    assert_eq!((after.uid, after.gid), (before.uid, before.gid));
    assert_eq!(read_all(&fs, f), b"lowerDATAa");
    assert_eq!(
        std::fs::read(&lower).unwrap(),
        b"lower data",
        "the layer changed"
    );
    // A symlink copied up for a change of its times keeps its target.
    let link = at(&fs, "link").unwrap();
    let when = Timestamp {
        secs: 1_000_000,
        nanos: 0,
    };
    let set = SetAttr {
        mtime: SetTime::Client(when),
        ..SetAttr::default()
    };
    fs.setattr(&root(), link, &set, None).unwrap();
    assert_eq!(fs.readlink(&root(), link).unwrap(), b"target/path");
    assert_eq!(fs.getattr(link).unwrap().mtime, when);
    assert_eq!(fs.getattr(link).unwrap().fileid, link);
    // The data's times came along on the copy: a chmod alone keeps mtime.
    let g = at(&fs, "f").unwrap();
    assert_eq!(g, f);
    assert!(s.upper().join("f").exists());
}

#[test]
fn remove_of_a_lower_entry_leaves_a_whiteout_and_rmdir_sees_every_layer() {
    let s = Stack::new(2, |i, d| {
        std::fs::create_dir_all(d.join("dir")).unwrap();
        std::fs::write(d.join(format!("dir/f{i}")), b"x").unwrap();
    });
    let fs = s.open();
    let r = fs.root();
    let dir = at(&fs, "dir").unwrap();
    assert_eq!(names(&fs, dir), ["f0", "f1"]);
    fs.remove(&root(), dir, b"f1").unwrap();
    assert_eq!(
        fs.rmdir(&root(), r, b"dir"),
        Err(Error::NotEmpty),
        "f0 is still below"
    );
    fs.remove(&root(), dir, b"f0").unwrap();
    assert_eq!(names(&fs, dir), Vec::<String>::new());
    assert!(s.upper().join("dir/.wh.f0").exists());
    fs.rmdir(&root(), r, b"dir").unwrap();
    assert_eq!(at(&fs, "dir"), Err(Error::NoEnt));
    assert_eq!(fs.getattr(dir), Err(Error::Stale));
    // A new directory of that name shows nothing of the old ones.
    let again = fs.mkdir(&root(), r, b"dir", &SetAttr::default()).unwrap().0;
    assert_eq!(names(&fs, again.fileid), Vec::<String>::new());
    assert_ne!(again.fileid, dir);
    for l in &s.lowers {
        assert_eq!(
            std::fs::read_dir(l.join("dir")).unwrap().count(),
            1,
            "a layer changed"
        );
    }
}

#[test]
fn a_name_made_again_over_a_whiteout_takes_the_whiteout_away() {
    let s = Stack::new(1, |_, d| {
        for name in ["c", "r", "l", "m"] {
            std::fs::write(d.join(name), b"lower").unwrap();
        }
    });
    let fs = s.open();
    let r = fs.root();
    for name in ["c", "r", "l", "m"] {
        fs.remove(&root(), r, name.as_bytes()).unwrap();
        assert!(s.upper().join(format!(".wh.{name}")).exists());
    }
    let how = Create::Unchecked(SetAttr::default());
    fs.create(&root(), r, b"c", how).unwrap();
    let new = fs.create(&root(), r, b"new", how).unwrap().0.fileid;
    fs.rename(&root(), r, b"new", r, b"r").unwrap();
    fs.link(&root(), new, r, b"l").unwrap();
    fs.mkdir(&root(), r, b"m", &SetAttr::default()).unwrap();
    assert_eq!(names(&fs, r), ["c", "l", "m", "r"]);
    assert_eq!(read_all(&fs, at(&fs, "c").unwrap()), b"");
    assert_eq!(names(&fs, at(&fs, "m").unwrap()), Vec::<String>::new());
    let left: Vec<_> = std::fs::read_dir(s.upper())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".wh.") && n != STATE_IN_UPPER)
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "whiteouts left beside new entries"
    );
    // And a name never whited out is made without one.
    fs.create(&root(), r, b"fresh", Create::Unchecked(SetAttr::default()))
        .unwrap();
    assert!(!s.upper().join(".wh.fresh").exists());
}

/// A whiteout stands only over a name a layer below holds, the only place
/// one is made: over any other name the upper is not asked for one. A
/// stray one (left by hand, or by layers since taken away) neither hides a
/// name made over it nor is looked for, so a rename onto the name leaves it.
#[test]
fn a_whiteout_over_a_name_no_layer_below_holds_is_not_looked_for() {
    let s = Stack::new(1, |_, d| std::fs::write(d.join("lower"), b"x").unwrap());
    let fs = s.open();
    let r = fs.root();
    std::fs::write(s.upper().join(".wh.stray"), b"").unwrap();
    let how = Create::Unchecked(SetAttr::default());
    let new = fs.create(&root(), r, b"new", how).unwrap().0.fileid;
    fs.rename(&root(), r, b"new", r, b"stray").unwrap();
    assert_eq!(fs.lookup(&root(), r, b"stray").unwrap().fileid, new);
    assert_eq!(names(&fs, r), ["lower", "stray"]);
    assert!(
        s.upper().join(".wh.stray").exists(),
        "looked for and taken away: the rename asked the upper for it"
    );
    // Over a name below, a whiteout is still looked for and taken away.
    fs.remove(&root(), r, b"lower").unwrap();
    assert!(s.upper().join(".wh.lower").exists());
    fs.rename(&root(), r, b"stray", r, b"lower").unwrap();
    assert!(!s.upper().join(".wh.lower").exists());
    assert_eq!(names(&fs, r), ["lower"]);
}

/// What a change in a directory of the workspace's own costs in host
/// attribute reads, once the directory is kept: checking a handle's
/// generation none, the directory once before the change and once after.
#[test]
fn a_change_in_a_kept_directory_reads_its_attributes_once_before_and_once_after() {
    use layerfs_vfs::hostdir::stat_reads_during as reads;
    let s = Stack::new(1, |_, d| std::fs::write(d.join("lower"), b"x").unwrap());
    let fs = s.open();
    let me = root();
    let d = fs
        .mkdir(&me, fs.root(), b"d", &SetAttr::default())
        .unwrap()
        .0;
    let new = || Create::Guarded(SetAttr::default());
    fs.create(&me, d.fileid, b"first", new()).unwrap();
    let top = fs.getattr(fs.root()).unwrap();
    assert_eq!(
        reads(|| fs.still_names(top.fileid, top.generation).unwrap()),
        0
    );
    assert_eq!(reads(|| fs.still_names(d.fileid, d.generation).unwrap()), 0);
    let stale = || {
        assert_eq!(
            fs.still_names(d.fileid, d.generation ^ 1),
            Err(Error::Stale)
        )
    };
    assert_eq!(reads(stale), 1, "a generation not kept asks the host");
    // Between them: the new file. No layer below holds the name, so it is
    // not looked for first.
    let create = || {
        fs.create(&me, d.fileid, b"a", new()).unwrap();
    };
    assert_eq!(reads(create), 3);
    // The file CREATE made stays open for the writes that follow, known to
    // be the upper's: its first WRITE needs no copy-up.
    let a_attr = fs.lookup(&me, d.fileid, b"a").unwrap();
    let a = a_attr.fileid;
    assert!(!fs.may_copy_up(a, None));
    // Its handle is checked from what is kept too.
    assert_eq!(reads(|| fs.still_names(a, a_attr.generation).unwrap()), 0);
    let write = || {
        fs.write(&me, a, 0, b"data", Stability::Unstable).unwrap();
    };
    assert_eq!(reads(write), 2);
    // Between them: both names.
    let rename = || {
        fs.rename(&me, d.fileid, b"a", d.fileid, b"b").unwrap();
    };
    assert_eq!(reads(rename), 4);
    // A file of the upper's own: itself before and after.
    let b = fs.lookup(&me, d.fileid, b"b").unwrap().fileid;
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    let setattr = || {
        fs.setattr(&me, b, &chmod, None).unwrap();
    };
    assert_eq!(reads(setattr), 2);
    // Between them: the name.
    let remove = || {
        fs.remove(&me, d.fileid, b"b").unwrap();
    };
    assert_eq!(reads(remove), 3);
    // Gone, it is no longer kept, and its handle is stale.
    assert_eq!(fs.still_names(a, a_attr.generation), Err(Error::Stale));
}

/// A file the workspace keeps open, removed from the upper behind its
/// back, takes no more writes: they are `Stale`, not written to a file no
/// name leads to, and so is its handle.
#[test]
fn a_file_removed_from_the_upper_behind_the_workspace_is_stale() {
    let s = Stack::new(1, |_, _| {});
    let fs = s.open();
    let me = root();
    let (f, _) = fs
        .create(&me, fs.root(), b"f", Create::Guarded(SetAttr::default()))
        .unwrap();
    fs.write(&me, f.fileid, 0, b"kept", Stability::Unstable)
        .unwrap();
    std::fs::remove_file(s.upper().join("f")).unwrap();
    let write = fs.write(&me, f.fileid, 0, b"lost", Stability::Unstable);
    assert_eq!(write.err(), Some(Error::Stale));
    assert_eq!(fs.commit(f.fileid).err(), Some(Error::Stale));
    assert_eq!(fs.still_names(f.fileid, f.generation), Err(Error::Stale));
}

#[test]
fn allocating_in_a_lower_file_copies_it_up_and_leaves_the_layer_as_it_was() {
    let data = vec![7u8; 64 * 1024];
    let s = Stack::new(1, |_, l| std::fs::write(l.join("f"), &data).unwrap());
    let fs = s.open();
    let f = at(&fs, "f").unwrap();
    // A hole punched in the middle reads as zeros; the size stays.
    let punched = fs.allocate(f, 16 * 1024, 16 * 1024, Allocate::PunchHole);
    assert!(punched.is_ok(), "{punched:?}");
    let mut expected = data.clone();
    expected[16 * 1024..32 * 1024].fill(0);
    assert_eq!(read_all(&fs, f), expected);
    // Space past the end: the file grows to it with Extend, not with KeepSize.
    fs.allocate(f, 64 * 1024, 4096, Allocate::KeepSize).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 64 * 1024);
    let grown = fs.allocate(f, 64 * 1024, 4096, Allocate::Extend).unwrap();
    assert_eq!(grown.after.map(|a| a.size), Some(68 * 1024));
    assert_eq!(fs.getattr(f).unwrap().size, 68 * 1024);
    assert_eq!(fs.getattr(f).unwrap().fileid, f, "the copy keeps the id");
    assert_eq!(
        std::fs::read(s.lowers[0].join("f")).unwrap(),
        data,
        "the layer is untouched"
    );
}

/// A name only the upper holds, made again, is answered as a local
/// filesystem answers (and as RFC 1813 asks), though it is not looked for
/// before the host is asked to make it.
#[test]
fn making_a_name_only_the_upper_holds_answers_as_a_local_filesystem() {
    let s = Stack::new(1, |_, d| std::fs::write(d.join("lower"), b"x").unwrap());
    let fs = s.open();
    let me = root();
    let r = fs.root();
    let (file, _) = fs
        .create(&me, r, b"f", Create::Guarded(SetAttr::default()))
        .unwrap();
    fs.write(&me, file.fileid, 0, b"data", Stability::FileSync)
        .unwrap();
    let (dir, _) = fs.mkdir(&me, r, b"d", &SetAttr::default()).unwrap();
    let guarded = Create::Guarded(SetAttr::default());
    assert_eq!(fs.create(&me, r, b"f", guarded).err(), Some(Error::Exist));
    let again = fs.create(&me, r, b"f", Create::Unchecked(SetAttr::default()));
    assert_eq!(again.unwrap().0.fileid, file.fileid);
    assert_eq!(
        read_all(&fs, file.fileid),
        b"data",
        "UNCHECKED keeps the data"
    );
    let unchecked = Create::Unchecked(SetAttr::default());
    assert_eq!(fs.create(&me, r, b"d", unchecked).err(), Some(Error::IsDir));
    let exclusive = Create::Exclusive(*b"verifier");
    assert_eq!(fs.create(&me, r, b"f", exclusive).err(), Some(Error::Exist));
    let set = SetAttr::default();
    assert_eq!(fs.mkdir(&me, r, b"f", &set).err(), Some(Error::Exist));
    assert_eq!(fs.mkdir(&me, r, b"d", &set).err(), Some(Error::Exist));
    assert_eq!(
        fs.symlink(&me, r, b"d", b"t", &set).err(),
        Some(Error::Exist)
    );
    assert_eq!(fs.getattr(dir.fileid).unwrap().kind, FileKind::Directory);
    assert_eq!(names(&fs, r), ["d", "f", "lower"]);
}

#[test]
fn a_lower_directory_renames_without_exdev_and_keeps_every_id() {
    let s = Stack::new(2, |i, d| {
        std::fs::create_dir_all(d.join("src/sub")).unwrap();
        std::fs::write(d.join(format!("src/sub/f{i}")), format!("layer {i}")).unwrap();
    });
    let fs = s.open();
    let r = fs.root();
    let ids: Vec<_> = ["src", "src/sub", "src/sub/f0", "src/sub/f1"]
        .iter()
        .map(|p| at(&fs, p).unwrap())
        .collect();
    fs.rename(&root(), r, b"src", r, b"dst").unwrap();
    assert_eq!(at(&fs, "src"), Err(Error::NoEnt));
    let moved: Vec<_> = ["dst", "dst/sub", "dst/sub/f0", "dst/sub/f1"]
        .iter()
        .map(|p| at(&fs, p).unwrap())
        .collect();
    assert_eq!(ids, moved);
    assert_eq!(read_all(&fs, moved[2]), b"layer 0");
    assert_eq!(read_all(&fs, moved[3]), b"layer 1");
    // And over an empty lower directory, which must not show through.
    drop(fs);
    let s = Stack::new(1, |_, d| {
        std::fs::create_dir_all(d.join("a")).unwrap();
        std::fs::create_dir_all(d.join("b")).unwrap();
        std::fs::write(d.join("b/old"), b"x").unwrap();
    });
    let fs = s.open();
    let r = fs.root();
    let b = at(&fs, "b").unwrap();
    fs.remove(&root(), b, b"old").unwrap();
    fs.rename(&root(), r, b"a", r, b"b").unwrap();
    assert_eq!(names(&fs, at(&fs, "b").unwrap()), Vec::<String>::new());
    assert_eq!(names(&fs, r), ["b"]);
}

#[test]
fn lower_hard_links_stay_one_file_after_copy_up_of_either_name() {
    for which in ["one", "two"] {
        let s = Stack::new(1, |_, d| {
            std::fs::create_dir(d.join("x")).unwrap();
            std::fs::write(d.join("one"), b"shared").unwrap();
            std::fs::hard_link(d.join("one"), d.join("x/two")).unwrap();
        });
        let fs = s.open();
        let path = if which == "one" { "one" } else { "x/two" };
        let other = if which == "one" { "x/two" } else { "one" };
        let id = at(&fs, path).unwrap();
        assert_eq!(at(&fs, other).unwrap(), id);
        fs.write(&root(), id, 0, b"SH", Stability::FileSync)
            .unwrap();
        let o = at(&fs, other).unwrap();
        assert_eq!(o, id);
        assert_eq!(read_all(&fs, o), b"SHared");
        assert_eq!(fs.getattr(o).unwrap().nlink, 2);
        let up = s.upper();
        assert_eq!(
            std::fs::metadata(up.join("one")).unwrap().ino(),
            std::fs::metadata(up.join("x/two")).unwrap().ino()
        );
    }
}

#[test]
fn ids_and_data_survive_a_restart_and_leftover_copies_are_cleared() {
    let s = Stack::new(1, |_, d| {
        std::fs::create_dir(d.join("d")).unwrap();
        std::fs::write(d.join("d/f"), b"lower").unwrap();
    });
    let fs = s.open();
    let f = at(&fs, "d/f").unwrap();
    let before = fs.getattr(f).unwrap();
    fs.write(&root(), f, 0, b"upper", Stability::FileSync)
        .unwrap();
    drop(fs);
    // A copy a crash left in the staging directory is never shown.
    let work = s.upper().join(STATE_IN_UPPER).join("work");
    std::fs::write(work.join("t99"), b"half a copy").unwrap();
    let fs = s.open();
    assert!(!work.join("t99").exists());
    // The handle's id is found again, without a lookup first.
    let again = fs.getattr(f).unwrap();
    assert_eq!(
        (again.fileid, again.generation),
        (before.fileid, before.generation)
    );
    assert_eq!(read_all(&fs, f), b"upper");
}

#[global_allocator]
static ALLOC: LargestPerThread = LargestPerThread;

#[test]
fn a_copy_up_streams_the_file_and_never_holds_it_in_memory() {
    const SIZE: usize = 32 << 20;
    let s = Stack::new(1, |_, d| {
        let data: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
        std::fs::write(d.join("big"), &data).unwrap();
    });
    let fs = s.open();
    let big = at(&fs, "big").unwrap();
    let largest = largest_allocation_while(|| {
        fs.write(&root(), big, SIZE as u64, b"!", Stability::Unstable)
            .unwrap();
    });
    assert!(
        largest < 1 << 20,
        "an allocation of {largest} bytes during copy-up"
    );
    assert_eq!(fs.getattr(big).unwrap().size, SIZE as u64 + 1);
    let mut tail = Vec::new();
    fs.read(&root(), big, SIZE as u64 - 2, 10, &mut tail)
        .unwrap();
    assert_eq!(
        tail,
        [((SIZE - 2) % 251) as u8, ((SIZE - 1) % 251) as u8, b'!']
    );
}

#[test]
fn kinds_show_as_the_top_layer_has_them() {
    let s = Stack::new(2, |i, d| {
        if i == 0 {
            std::fs::create_dir(d.join("x")).unwrap();
            std::fs::write(d.join("x/inside"), b"").unwrap();
        } else {
            std::fs::write(d.join("x"), b"file now").unwrap();
        }
    });
    let fs = s.open();
    let x = at(&fs, "x").unwrap();
    assert_eq!(fs.getattr(x).unwrap().kind, FileKind::Regular);
    assert_eq!(at(&fs, "x/inside"), Err(Error::NotDir));
}

#[test]
fn a_copy_up_that_fills_the_disk_is_nospc_and_leaves_nothing_behind() {
    let s = Stack::new(1, |_, d| {
        std::fs::write(d.join("big"), vec![1u8; 4 << 20]).unwrap();
        std::fs::write(d.join("small"), b"small").unwrap();
    });
    std::fs::create_dir(s.upper()).unwrap();
    let Some(_tmpfs) = or_skip(Mounted::tmpfs(&s.upper(), "1m"), "a 1 MiB upper") else {
        return;
    };
    let fs = s.open();
    let big = at(&fs, "big").unwrap();
    let res = fs.write(&root(), big, 0, b"x", Stability::Unstable);
    assert_eq!(res.err(), Some(Error::NoSpc));
    // The lower file still shows, whole, and no half copy takes space.
    assert_eq!(fs.getattr(big).unwrap().size, 4 << 20);
    assert!(!s.upper().join("big").exists());
    let work = s.upper().join(STATE_IN_UPPER).join("work");
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "a half copy was left"
    );
    // Smaller changes still fit.
    let small = at(&fs, "small").unwrap();
    fs.write(&root(), small, 0, b"SMALL", Stability::FileSync)
        .unwrap();
    assert_eq!(read_all(&fs, small), b"SMALL");
}

#[test]
fn layers_on_a_filesystem_that_renumbers_files_are_refused() {
    let ov = CrossOverlay::new(|_| {});
    let Some(ov) = or_skip(ov, "an overlay across filesystems") else {
        return;
    };
    let (merged, beside) = (ov.merged(), ov.beside());
    std::fs::create_dir(merged.join("layer")).unwrap();
    let fresh = beside.join("upper");
    let err = StackFs::open_in_upper(&[merged.join("layer")], &fresh)
        .err()
        .expect("a layer whose directories are renumbered was accepted");
    assert!(
        err.to_string().contains("does not keep inode numbers"),
        "{err}"
    );
    assert!(
        !fresh.join(STATE_IN_UPPER).exists(),
        "state was made before the refusal"
    );
    let err = StackFs::open_in_upper(&[beside.join("lower")], &merged.join("upper"))
        .err()
        .expect("an upper whose directories are renumbered was accepted");
    assert!(err.to_string().contains("merged/upper"), "{err}");
    assert!(!merged.join("upper").join(STATE_IN_UPPER).exists());
}

#[test]
fn a_second_stack_on_a_served_upper_is_refused_and_touches_nothing() {
    let s = Stack::new(1, |_, d| std::fs::write(d.join("a"), b"lower").unwrap());
    let first = s.open();
    let (a, _) = first
        .create(
            &root(),
            first.root(),
            b"new",
            Create::Unchecked(SetAttr::default()),
        )
        .unwrap();
    let work = s.upper().join(STATE_IN_UPPER).join("work");
    std::fs::write(work.join("half-made"), b"a copy in progress").unwrap();

    let second = StackFs::open_in_upper(&s.lowers, &s.upper());
    let message = second.err().expect("refused").to_string();
    assert!(message.contains("already served"), "{message}");
    assert!(
        work.join("half-made").exists(),
        "the server's staging area was cleared"
    );
    assert_eq!(first.getattr(a.fileid).unwrap().fileid, a.fileid);

    drop(first);
    let third = s.open();
    assert_eq!(
        third.lookup(&root(), third.root(), b"new").unwrap().fileid,
        a.fileid
    );
}

#[test]
fn renaming_over_one_name_of_a_lower_hard_link_leaves_the_other_with_one_link() {
    // As overlayfs shows it: the name replaced no longer counts.
    let s = Stack::new(1, |_, d| {
        std::fs::create_dir(d.join("a")).unwrap();
        std::fs::write(d.join("b"), b"shared").unwrap();
        std::fs::hard_link(d.join("b"), d.join("a/a")).unwrap();
        std::os::unix::fs::symlink("t0", d.join("c")).unwrap();
    });
    let fs = s.open();
    let r = fs.root();
    let other = at(&fs, "a/a").unwrap();
    assert_eq!(fs.getattr(other).unwrap().nlink, 2);
    fs.rename(&root(), r, b"c", r, b"b").unwrap();
    assert_eq!(fs.getattr(other).unwrap().nlink, 1);
    assert_eq!(read_all(&fs, other), b"shared");
    assert_eq!(fs.readlink(&root(), at(&fs, "b").unwrap()).unwrap(), b"t0");
    assert_eq!(
        std::fs::read(s.lowers[0].join("b")).unwrap(),
        b"shared",
        "a layer changed"
    );
}

/// Mode, size and link count.
type Shown = (u32, u64, u32);

/// Each entry of a listing with attributes, next to what getattr says of it.
fn listed_vs_getattr(fs: &StackFs, dir: FileId) -> Vec<(String, Shown, Shown)> {
    let page = fs.readdir(&root(), dir, 0, 1000, true).unwrap();
    page.entries
        .iter()
        .filter(|e| e.cookie > 2)
        .map(|e| {
            let listed = e.attr.expect("attributes asked for");
            let now = fs.getattr(e.fileid).unwrap();
            let key = |a: layerfs_vfs::Attr| -> Shown { (a.mode & 0o7777, a.size, a.nlink) };
            (
                String::from_utf8(e.name.to_vec()).unwrap(),
                key(listed),
                key(now),
            )
        })
        .collect()
}

fn assert_listing_current(fs: &StackFs, dir: FileId, when: &str) {
    for (name, listed, now) in listed_vs_getattr(fs, dir) {
        assert_eq!(
            listed, now,
            "{name} after {when}: listed (mode, size, nlink) vs getattr"
        );
    }
}

#[test]
fn a_listing_shows_each_files_attributes_as_they_are_after_every_change() {
    let s = Stack::new(2, |i, d| {
        std::fs::create_dir(d.join("d")).unwrap();
        std::fs::write(d.join(format!("d/f{i}")), b"lower").unwrap();
        std::fs::write(d.join(format!("d/g{i}")), b"lower").unwrap();
        if i == 1 {
            std::fs::hard_link(d.join("d/g1"), d.join("d/h1")).unwrap();
        }
    });
    let fs = s.open();
    let d = at(&fs, "d").unwrap();
    // Twice: the second listing's lower attributes are the kept ones.
    assert_listing_current(&fs, d, "opening");
    assert_listing_current(&fs, d, "listing again");
    let f0 = at(&fs, "d/f0").unwrap();
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(&root(), f0, &chmod, None).unwrap();
    assert_listing_current(&fs, d, "a chmod that copied f0 up");
    let f1 = at(&fs, "d/f1").unwrap();
    fs.write(&root(), f1, 0, b"longer than before", Stability::FileSync)
        .unwrap();
    assert_listing_current(&fs, d, "a write that copied f1 up");
    // Through the host descriptor, as the NFS door writes.
    let host = fs
        .host_file(&root(), f1, true)
        .unwrap()
        .expect("an upper file");
    rustix::io::pwrite(&*host, b"x", 100).unwrap();
    assert_listing_current(&fs, d, "a write to f1's host file");
    let g1 = at(&fs, "d/g1").unwrap();
    fs.write(&root(), g1, 0, b"LOWER!", Stability::FileSync)
        .unwrap();
    assert_listing_current(&fs, d, "a write that copied up both names of g1");
    fs.remove(&root(), d, b"h1").unwrap();
    assert_listing_current(&fs, d, "removing one of g1's names");
    let listed = listed_vs_getattr(&fs, d);
    assert_eq!(listed.iter().find(|e| e.0 == "f0").unwrap().1 .0, 0o600);
    assert_eq!(listed.iter().find(|e| e.0 == "f1").unwrap().1 .1, 101);
    assert_eq!(listed.iter().find(|e| e.0 == "g1").unwrap().1 .2, 1);
}

/// Copies up one small file after another while the upper's filesystem has
/// no room, a page more every third try, so that each step of a copy-up (the
/// staged file, its data, the inode map's log) in turn is the one that meets
/// the full disk; an fsync then fails until the inode map's commit finds
/// room; then gives all the room back.
#[test]
fn a_full_upper_is_nospc_at_every_step_and_the_stack_recovers_when_space_returns() {
    const FILES: usize = 60;
    let s = Stack::new(1, |_, d| {
        for i in 0..FILES {
            std::fs::write(d.join(format!("f{i}")), b"lower").unwrap();
        }
    });
    std::fs::create_dir(s.upper()).unwrap();
    let Some(_tmpfs) = or_skip(Mounted::tmpfs(&s.upper(), "1m"), "a 1 MiB upper") else {
        return;
    };
    let fs = s.open();
    let ids: Vec<FileId> = (0..FILES)
        .map(|i| at(&fs, &format!("f{i}")).unwrap())
        .collect();
    let filler = std::fs::File::create(s.upper().join("filler")).unwrap();
    let mut full = 0;
    while (&filler).write_all(&[0u8; 4096]).is_ok() {
        full += 4096;
    }
    let mut copied = [false; FILES];
    for (i, &id) in ids.iter().enumerate() {
        filler.set_len(full - (i as u64 / 3) * 4096).unwrap();
        match fs.write(&root(), id, 0, b"UPPER", Stability::Unstable) {
            Ok(_) => copied[i] = true,
            Err(e) => assert_eq!(e, Error::NoSpc, "copy-up of f{i} on a full disk"),
        }
    }
    assert!(copied.contains(&false), "the disk was never full");
    assert!(copied.contains(&true), "no copy-up found room");
    // The copy-ups' records are durable at an fsync, which needs room.
    let synced = ids.iter().zip(copied).find(|(_, c)| *c).unwrap().0;
    filler.set_len(full).unwrap();
    assert_eq!(
        fs.commit(*synced).err(),
        Some(Error::NoSpc),
        "fsync with no room"
    );
    filler.set_len(full - 64 * 4096).unwrap();
    fs.commit(*synced).expect("fsync once room is back");
    let work = s.upper().join(STATE_IN_UPPER).join("work");
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "a half copy was left"
    );
    // Each file shows whole: the lower's bytes or the change, never a part.
    for (i, &id) in ids.iter().enumerate() {
        let want: &[u8] = if copied[i] { b"UPPER" } else { b"lower" };
        assert_eq!(read_all(&fs, id), want, "f{i}");
    }
    // Room again: every copy-up works, and keeps the file's id.
    drop(filler);
    std::fs::remove_file(s.upper().join("filler")).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        fs.write(&root(), id, 0, b"AGAIN", Stability::FileSync)
            .unwrap_or_else(|e| panic!("f{i} after space returned: {e}"));
    }
    drop(fs);
    let fs = s.open();
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(
            at(&fs, &format!("f{i}")).unwrap(),
            id,
            "f{i}'s id after a restart"
        );
        assert_eq!(read_all(&fs, id), b"AGAIN", "f{i}");
    }
}

/// A filesystem mounted inside a layer numbers its inodes apart from the
/// layer's: its files are refused (EXDEV), the name is still listed, and
/// the rest of the directory lists and reads as before, also where the
/// mount point merges with a directory of another layer.
#[test]
fn a_filesystem_mounted_inside_a_layer_is_refused_and_its_name_still_listed() {
    let s = Stack::new(2, |i, d| {
        std::fs::create_dir(d.join("m")).unwrap();
        std::fs::write(d.join(format!("f{i}")), b"layer").unwrap();
    });
    let Some(_inner) = or_skip(
        Mounted::tmpfs(&s.lowers[0].join("m"), "1m"),
        "tmpfs in a layer",
    ) else {
        return;
    };
    std::fs::write(s.lowers[0].join("m/inside"), b"mounted").unwrap();
    let fs = s.open();
    assert_eq!(at(&fs, "m"), Err(Error::XDev));
    assert_eq!(at(&fs, "m/inside"), Err(Error::XDev));
    assert_eq!(names(&fs, fs.root()), ["f0", "f1", "m"]);
    let page = fs.readdir(&root(), fs.root(), 0, 1000, true).unwrap();
    for e in page.entries.iter().filter(|e| e.cookie > 2) {
        assert_eq!(e.attr.is_some(), &e.name[..] != b"m", "{:?}", e.name);
    }
    assert_eq!(read_all(&fs, at(&fs, "f0").unwrap()), b"layer");
}

/// A copy-up's identity goes to the inode map's log, one entry each, and
/// the database is written only where durability is promised (an fsync):
/// one commit for all the copy-ups before it, not one per copy-up.
#[test]
fn copy_ups_write_the_inode_map_only_at_an_fsync() {
    const FILES: usize = 100;
    let s = Stack::new(1, |_, d| {
        for i in 0..FILES {
            std::fs::write(d.join(format!("f{i}")), b"lower").unwrap();
        }
    });
    let fs = s.open();
    let ids: Vec<FileId> = (0..FILES)
        .map(|i| at(&fs, &format!("f{i}")).unwrap())
        .collect();
    let state = s.upper().join(STATE_IN_UPPER);
    let db = || {
        let m = std::fs::metadata(state.join("inodes.redb")).unwrap();
        (m.len(), m.modified().unwrap())
    };
    let log = || std::fs::metadata(state.join("inodes.log")).unwrap().len();
    let before = db();
    for &id in &ids {
        fs.write(&root(), id, 0, b"UPPER", Stability::Unstable)
            .unwrap();
    }
    assert_eq!(db(), before, "the database was written by a copy-up");
    assert_eq!(log(), 48 * FILES as u64, "one log entry per copy-up");
    fs.commit(ids[0]).unwrap();
    assert_ne!(
        db(),
        before,
        "an fsync left the copy-ups' records in the log"
    );
    assert_eq!(log(), 0, "the log is moved into the database at an fsync");
    // Every copy kept its lower id across a restart.
    drop(fs);
    let fs = s.open();
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(at(&fs, &format!("f{i}")).unwrap(), id, "f{i}");
        assert_eq!(read_all(&fs, id), b"UPPER");
    }
}

/// fsync(2) of a directory (the FUSE door asks it for a directory's
/// descriptor) works for the root, a directory with an upper part and one
/// only the layers hold, and changes nothing.
#[test]
fn a_directory_is_committed_whether_or_not_the_upper_holds_it() {
    let s = Stack::new(1, |_, d| {
        std::fs::create_dir_all(d.join("low/deep")).unwrap();
        std::fs::write(d.join("low/f"), b"lower").unwrap();
    });
    let fs = s.open();
    let f = at(&fs, "low/f").unwrap();
    fs.write(&root(), f, 0, b"UPPER", Stability::Unstable)
        .unwrap();
    let (low, deep) = (at(&fs, "low").unwrap(), at(&fs, "low/deep").unwrap());
    for id in [fs.root(), low, deep] {
        let done = fs.commit(id).unwrap();
        assert_eq!(done.after.map(|a| a.fileid), Some(id));
    }
    assert!(
        !s.upper().join("low/deep").exists(),
        "a commit of a lower directory copied it up"
    );
}

/// The file a door holds for an open stands for the file while it is the
/// file's top instance, and only then: extended attributes are read through
/// it, and the door hands it to the kernel as the host file, until a copy-up
/// or a removal puts another in its place.
#[test]
fn a_held_file_stands_for_its_file_until_a_copy_up_or_removal() {
    use layerfs_vfs::XattrFlags;
    let s = Stack::new(1, |_, d| {
        std::fs::write(d.join("f"), b"lower").unwrap();
        let empty = rustix::fs::XattrFlags::empty();
        rustix::fs::lsetxattr(d.join("f"), "user.k", b"lower", empty).unwrap();
    });
    let fs = s.open();
    let f = at(&fs, "f").unwrap();
    let lower = fs.file_to_keep(f, false).unwrap().expect("the lower file");
    assert!(!fs.kept_is_host_file(f, &lower, false), "a lower file");
    assert_eq!(fs.getxattr(f, b"user.k").unwrap(), b"lower");
    // A writer's open copies the file up, attributes and all.
    let upper = fs.file_to_keep(f, true).unwrap().expect("the upper file");
    assert!(fs.kept_is_host_file(f, &upper, true));
    assert!(fs.kept_is_host_file(f, &upper, false));
    assert!(!fs.kept_is_host_file(f, &lower, false), "the reader's file");
    assert_eq!(fs.getxattr(f, b"user.k").unwrap(), b"lower");
    fs.setxattr(f, b"user.k", b"upper", XattrFlags::Replace)
        .unwrap();
    let held = fs.file_to_keep(f, false).unwrap().expect("the upper file");
    assert!(!held.is(&lower), "the lower file again");
    assert_eq!(fs.getxattr(f, b"user.k").unwrap(), b"upper");
    fs.removexattr(f, b"user.k").unwrap();
    assert_eq!(fs.getxattr(f, b"user.k"), Err(Error::NoData));
    fs.remove(&root(), fs.root(), b"f").unwrap();
    assert!(!fs.kept_is_host_file(f, &held, true), "a removed file");
}

/// A lower file is only ever read: the descriptor the stack keeps for it is
/// open for reading alone (one open for writing would also keep the host
/// from running the file: ETXTBSY).
#[cfg(target_os = "linux")]
#[test]
fn a_lower_file_is_held_open_for_reading_only() {
    let s = Stack::new(1, |_, l| std::fs::write(l.join("f"), b"lower").unwrap());
    let fs = s.open();
    let f = at(&fs, "f").unwrap();
    assert_eq!(read_all(&fs, f), b"lower");
    let lower = s.lowers[0].join("f").canonicalize().unwrap();
    let mut held = 0;
    for fd in std::fs::read_dir("/proc/self/fd").unwrap() {
        let fd = fd.unwrap();
        if std::fs::read_link(fd.path()).ok() != Some(lower.clone()) {
            continue;
        }
        let info = format!("/proc/self/fdinfo/{}", fd.file_name().to_string_lossy());
        let Ok(info) = std::fs::read_to_string(info) else {
            continue;
        };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        assert_eq!(
            flags & libc::O_ACCMODE as u32,
            libc::O_RDONLY as u32,
            "{info}"
        );
        held += 1;
    }
    assert!(held > 0, "no descriptor for the lower file was found");
}

/// Where a lower file was found is kept past changes to other files (so an
/// open after a walk does not look through the layers again), and never
/// past a change to the file itself: a removed or replaced lower file opened
/// for writing by the id a client still holds is stale, not copied up again
/// over its whiteout, and a copied-up file shows its copy.
#[test]
fn a_lower_file_found_before_another_changed_is_still_where_its_own_changes_left_it() {
    let s = Stack::new(1, |_, l| {
        for name in ["a", "b", "c", "d", "e"] {
            std::fs::write(l.join(name), name).unwrap();
        }
        std::fs::write(l.join("h1"), b"linked").unwrap();
        std::fs::hard_link(l.join("h1"), l.join("h2")).unwrap();
    });
    let fs = s.open();
    let host = fs.host_files().unwrap();
    let id = |name: &str| at(&fs, name).unwrap();
    let (a, b, c, d, e, h1) = (id("a"), id("b"), id("c"), id("d"), id("e"), id("h1"));
    assert_eq!(id("h2"), h1);
    // Another file's copy-up and writes.
    fs.write(&root(), a, 1, b"A", Stability::FileSync).unwrap();
    // Removed: its id is stale, for writing too, and its name stays gone.
    fs.remove(&root(), fs.root(), b"b").unwrap();
    assert_eq!(fs.getattr(b), Err(Error::Stale));
    assert_eq!(host.host_file(&root(), b, true).err(), Some(Error::Stale));
    assert_eq!(
        fs.write(&root(), b, 0, b"B", Stability::FileSync).err(),
        Some(Error::Stale)
    );
    // Replaced by a rename: the same.
    fs.rename(&root(), fs.root(), b"c", fs.root(), b"d")
        .unwrap();
    assert_eq!(fs.getattr(d), Err(Error::Stale));
    assert_eq!(host.host_file(&root(), d, true).err(), Some(Error::Stale));
    assert_eq!(read_all(&fs, id("d")), b"c");
    assert_eq!(id("d"), c);
    // Copied up by a write: its copy is what opens and lookups show.
    fs.write(&root(), e, 1, b"E", Stability::FileSync).unwrap();
    assert_eq!(fs.getattr(e).unwrap().size, 2);
    let fd = host.host_file(&root(), e, true).unwrap().unwrap();
    assert_eq!(rustix::fs::fstat(&*fd).unwrap().st_size, 2);
    assert_eq!(fs.lookup(&root(), fs.root(), b"e").unwrap().size, 2);
    // One name of a lower hard link removed: the other is the one file.
    fs.remove(&root(), fs.root(), b"h1").unwrap();
    fs.write(&root(), h1, 6, b"!", Stability::FileSync).unwrap();
    assert_eq!(read_all(&fs, id("h2")), b"linked!");
    assert_eq!(names(&fs, fs.root()), ["a", "d", "e", "h2"]);
    for (name, data) in [("a", "a"), ("b", "b"), ("c", "c"), ("d", "d"), ("e", "e")] {
        let layer = std::fs::read(s.lowers[0].join(name)).unwrap();
        assert_eq!(layer, data.as_bytes(), "the layer's {name} changed");
    }
}
