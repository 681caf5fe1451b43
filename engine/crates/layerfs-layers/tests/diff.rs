//! `StackFs::diff`, what a workspace changed over its layers path by path,
//! and `StackFs::reset`, which throws changes away.

use std::path::Path;

use layerfs_layers::{ChangeKind, StackFs};
use layerfs_vfs::{Caller, Create, FileId, Filesystem, SetAttr, Stability};

const ROOT: FileId = 1;

fn who() -> Caller {
    Caller::root()
}

fn id(fs: &StackFs, path: &str) -> FileId {
    path.split('/').fold(ROOT, |dir, name| {
        fs.lookup(&who(), dir, name.as_bytes()).unwrap().fileid
    })
}

/// The diff as `podman diff` prints it: `A /path`, `C /path (what)`, `D /path`.
fn lines(fs: &StackFs) -> Vec<String> {
    fs.diff()
        .unwrap()
        .into_iter()
        .map(|c| {
            let path = String::from_utf8(c.path).unwrap();
            match c.kind {
                ChangeKind::Added => format!("A {path}"),
                ChangeKind::Changed => format!("C {path} ({})", c.what.join(",")),
                ChangeKind::Deleted => format!("D {path}"),
            }
        })
        .collect()
}

fn layer(root: &Path) {
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::create_dir_all(root.join("tree/sub")).unwrap();
    std::fs::create_dir_all(root.join("opaque")).unwrap();
    std::fs::write(root.join("a"), b"lower a").unwrap();
    std::fs::write(root.join("same"), b"same bytes").unwrap();
    std::fs::write(root.join("gone"), b"x").unwrap();
    std::fs::write(root.join("d/x"), b"x").unwrap();
    std::fs::write(root.join("d/y"), b"y").unwrap();
    std::fs::write(root.join("tree/t"), b"t").unwrap();
    std::fs::write(root.join("tree/sub/u"), b"u").unwrap();
    std::fs::write(root.join("opaque/old"), b"o").unwrap();
    std::os::unix::fs::symlink("a", root.join("link")).unwrap();
    // Times far from the run's, so a change of them shows.
    for p in ["", "d", "tree", "tree/sub", "opaque"] {
        let t = std::fs::FileTimes::new()
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000));
        std::fs::File::open(root.join(p))
            .unwrap()
            .set_times(t)
            .unwrap();
    }
}

#[test]
fn each_change_shows_once_with_what_changed_and_nothing_else() {
    let t = tempfile::tempdir().unwrap();
    layer(&t.path().join("lower"));
    let fs = StackFs::open(
        &[t.path().join("lower")],
        &t.path().join("upper"),
        &t.path().join("state"),
    )
    .unwrap();
    assert!(lines(&fs).is_empty(), "a new workspace changed nothing");
    let w = who();
    // Data, a mode, and a write of the bytes already there.
    fs.write(&w, id(&fs, "a"), 0, b"upper", Stability::Unstable)
        .unwrap();
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(&w, id(&fs, "d/x"), &chmod, None).unwrap();
    fs.write(&w, id(&fs, "same"), 0, b"same", Stability::Unstable)
        .unwrap();
    // Added: a file, a directory with a file in it.
    let made = |dir, name: &str| {
        fs.create(
            &w,
            dir,
            name.as_bytes(),
            Create::Unchecked(SetAttr::default()),
        )
        .unwrap()
        .0
        .fileid
    };
    made(ROOT, "new");
    let newdir = fs
        .mkdir(&w, ROOT, b"newdir", &SetAttr::default())
        .unwrap()
        .0
        .fileid;
    made(newdir, "f");
    // Deleted: a file, a file in a directory, a whole tree.
    fs.remove(&w, ROOT, b"gone").unwrap();
    fs.remove(&w, id(&fs, "d"), b"y").unwrap();
    fs.remove(&w, id(&fs, "tree/sub"), b"u").unwrap();
    fs.rmdir(&w, id(&fs, "tree"), b"sub").unwrap();
    fs.remove(&w, id(&fs, "tree"), b"t").unwrap();
    fs.rmdir(&w, ROOT, b"tree").unwrap();
    // A directory removed and made again: opaque, its old names deleted.
    fs.remove(&w, id(&fs, "opaque"), b"old").unwrap();
    fs.rmdir(&w, ROOT, b"opaque").unwrap();
    let again = fs
        .mkdir(&w, ROOT, b"opaque", &SetAttr::default())
        .unwrap()
        .0
        .fileid;
    made(again, "fresh");
    // A symlink replaced by a file: its type.
    fs.remove(&w, ROOT, b"link").unwrap();
    made(ROOT, "link");
    // The NFS client's file for one removed while open: not the workspace's.
    made(ROOT, ".nfs00000000000012340000000a");
    let got = lines(&fs);
    let want = [
        "C /a (data,times)",
        "C /d (times)",
        "C /d/x (mode)",
        "D /d/y",
        "D /gone",
        "C /link (type)",
        "A /new",
        "A /newdir",
        "A /newdir/f",
        "C /opaque (times)",
        "A /opaque/fresh",
        "D /opaque/old",
        // Written with its own bytes: only its time differs.
        "C /same (times)",
        "D /tree",
        "D /tree/sub",
        "D /tree/sub/u",
        "D /tree/t",
    ];
    assert_eq!(got, want);
    // The same answer again, and from a restart.
    assert_eq!(lines(&fs), want);
    drop(fs);
    let fs = StackFs::open(
        &[t.path().join("lower")],
        &t.path().join("upper"),
        &t.path().join("state"),
    )
    .unwrap();
    assert_eq!(lines(&fs), want);
}

fn read(fs: &StackFs, id: FileId) -> Vec<u8> {
    let mut out = Vec::new();
    fs.read(&who(), id, 0, 1 << 20, &mut out).unwrap();
    out
}

#[test]
fn a_reset_throws_away_the_changes_under_a_path_or_all_of_them() {
    let t = tempfile::tempdir().unwrap();
    layer(&t.path().join("lower"));
    let fs = StackFs::open(
        &[t.path().join("lower")],
        &t.path().join("upper"),
        &t.path().join("state"),
    )
    .unwrap();
    let w = who();
    let a = id(&fs, "a");
    fs.write(&w, a, 0, b"upper", Stability::Unstable).unwrap();
    let x = id(&fs, "d/x");
    fs.write(&w, x, 0, b"X", Stability::Unstable).unwrap();
    let new = fs
        .create(
            &w,
            id(&fs, "d"),
            b"new",
            Create::Unchecked(SetAttr::default()),
        )
        .unwrap()
        .0
        .fileid;
    fs.remove(&w, id(&fs, "d"), b"y").unwrap();
    fs.remove(&w, ROOT, b"gone").unwrap();
    fs.remove(&w, id(&fs, "opaque"), b"old").unwrap();
    fs.rmdir(&w, ROOT, b"opaque").unwrap();
    fs.mkdir(&w, ROOT, b"opaque", &SetAttr::default()).unwrap();

    // Under d only: d's changes go, the others stay.
    let done = fs.reset(&[vec![b"d".to_vec()]]).unwrap();
    assert!(
        done.names.contains(&(id(&fs, "d"), b"new".to_vec())),
        "{done:?}"
    );
    assert!(done.files.contains(&x));
    // d's upper part went whole: its parent's entries changed.
    assert_eq!(done.dirs_changed, [Vec::<Vec<u8>>::new()]);
    assert_eq!(read(&fs, x), b"x", "d/x reverted, same id");
    assert_eq!(
        fs.lookup(&w, id(&fs, "d"), b"new").unwrap_err(),
        layerfs_vfs::Error::NoEnt
    );
    assert!(
        fs.getattr(new).is_err(),
        "a file only the upper held is gone"
    );
    assert_eq!(
        read(&fs, id(&fs, "d/y")),
        b"y",
        "a removed lower file is back"
    );
    assert_eq!(
        lines(&fs),
        [
            "C /a (data,times)",
            "D /gone",
            "C /opaque (times)",
            "D /opaque/old"
        ]
    );

    // A new tree: its own name is what changed (dropping a directory's
    // entry drops what is below it), and it leaves the host at once from
    // the upper, soon from the work directory it was moved aside into.
    let fresh = fs
        .mkdir(&w, ROOT, b"fresh", &SetAttr::default())
        .unwrap()
        .0
        .fileid;
    let inner = fs
        .mkdir(&w, fresh, b"inner", &SetAttr::default())
        .unwrap()
        .0
        .fileid;
    for dir in [fresh, inner] {
        for n in 0..50 {
            let name = format!("f{n}");
            fs.create(
                &w,
                dir,
                name.as_bytes(),
                Create::Unchecked(SetAttr::default()),
            )
            .unwrap();
        }
    }
    let done = fs.reset(&[vec![b"fresh".to_vec()]]).unwrap();
    assert_eq!(done.names, [(ROOT, b"fresh".to_vec())]);
    assert!(!t.path().join("upper/fresh").exists());
    let work = t.path().join("state/work");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_dir(&work).unwrap().next().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the discarded tree stays in {work:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    // All of it: the workspace shows its layers again.
    fs.reset(&[]).unwrap();
    assert!(lines(&fs).is_empty(), "{:?}", lines(&fs));
    assert_eq!(read(&fs, a), b"lower a");
    assert_eq!(read(&fs, id(&fs, "opaque/old")), b"o");
    assert_eq!(read(&fs, id(&fs, "gone")), b"x");
    // A name in a directory: that directory changed, named from the root.
    fs.create(
        &w,
        id(&fs, "d"),
        b"later",
        Create::Unchecked(SetAttr::default()),
    )
    .unwrap();
    let done = fs.reset(&[vec![b"d".to_vec(), b"later".to_vec()]]).unwrap();
    assert_eq!(done.dirs_changed, [vec![b"d".to_vec()]]);
    // A path with nothing of the upper under it, and one that climbs out.
    let done = fs.reset(&[vec![b"tree".to_vec()]]).unwrap();
    assert!(done.dirs_changed.is_empty(), "{done:?}");
    assert_eq!(
        fs.reset(&[vec![b"..".to_vec()]]).unwrap_err(),
        layerfs_vfs::Error::Inval
    );
}

fn xattr_names(fs: &StackFs, id: FileId) -> Vec<String> {
    let list = fs.listxattr(id).unwrap();
    list.split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8(n.to_vec()).unwrap())
        .collect()
}

/// Extended attributes as overlayfs keeps them: read from the layer, set
/// and removed on a copy-up that brings the layer's along (the layer keeps
/// its own), hidden with a whiteout, not served in `system.`, and a change
/// of them is a change `diff` names.
#[test]
fn extended_attributes_copy_up_and_show_in_the_diff() {
    use layerfs_vfs::{Error, XattrFlags};
    let t = tempfile::tempdir().unwrap();
    let lower = t.path().join("lower");
    layer(&lower);
    let set = |p: &str, n: &str, v: &[u8]| {
        rustix::fs::lsetxattr(lower.join(p), n, v, rustix::fs::XattrFlags::empty()).unwrap()
    };
    set("a", "user.origin", b"layer");
    set("same", "user.origin", b"layer");
    set("d", "user.dir", b"d");
    let fs = StackFs::open(
        std::slice::from_ref(&lower),
        &t.path().join("upper"),
        &t.path().join("state"),
    )
    .unwrap();
    let a = id(&fs, "a");
    assert_eq!(fs.getxattr(a, b"user.origin").unwrap(), b"layer");
    assert_eq!(fs.getxattr(id(&fs, "d"), b"user.dir").unwrap(), b"d");
    assert_eq!(fs.getxattr(a, b"user.none"), Err(Error::NoData));
    assert_eq!(
        fs.getxattr(a, b"system.posix_acl_access"),
        Err(Error::NoData)
    );
    assert_eq!(
        fs.setxattr(a, b"system.posix_acl_access", b"x", XattrFlags::Either),
        Err(Error::NotSupp)
    );
    assert!(lines(&fs).is_empty(), "reading attributes changed nothing");

    fs.setxattr(a, b"user.added", b"new", XattrFlags::Create)
        .unwrap();
    assert_eq!(
        fs.setxattr(a, b"user.added", b"again", XattrFlags::Create),
        Err(Error::Exist)
    );
    assert_eq!(xattr_names(&fs, a), ["user.origin", "user.added"]);
    assert_eq!(lines(&fs), ["C /a (xattrs)"]);
    let mut buf = [0u8; 64];
    let n = rustix::fs::lgetxattr(lower.join("a"), "user.added", &mut buf[..]);
    assert!(n.is_err(), "the layer's file changed");

    fs.removexattr(id(&fs, "same"), b"user.origin").unwrap();
    assert_eq!(xattr_names(&fs, id(&fs, "same")), Vec::<String>::new());
    assert_eq!(
        fs.removexattr(id(&fs, "same"), b"user.origin"),
        Err(Error::NoData)
    );
    assert_eq!(lines(&fs), ["C /a (xattrs)", "C /same (xattrs)"]);

    // A whiteout hides the old file with its attributes.
    let w = who();
    fs.remove(&w, ROOT, b"a").unwrap();
    fs.create(&w, ROOT, b"a", Create::Unchecked(SetAttr::default()))
        .unwrap();
    assert_eq!(xattr_names(&fs, id(&fs, "a")), Vec::<String>::new());
}
