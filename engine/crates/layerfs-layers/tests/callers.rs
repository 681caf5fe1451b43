//! The rules a local kernel applies to callers who are not root, through
//! both filesystems (a flat `LocalFs` and a layered `StackFs` whose files
//! start in a lower layer). The server runs as root, so the kernel checks
//! nothing for these callers: each rule is the filesystem's own. Expected
//! results are Linux's on a local filesystem (tests/kernel/permissions.sh
//! compares the two through the kernel NFS client).

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::Path;

use layerfs_layers::StackFs;
use layerfs_vfs::{
    Caller, Create, Error, FileId, FileKind, Filesystem, LocalFs, SetAttr, Stability,
};

const OWNER: u32 = 65533;
const OTHER: u32 = 65534;
const GROUP: u32 = 65533;

fn user(uid: u32) -> Caller {
    Caller {
        uid,
        gid: uid,
        gids: layerfs_vfs::Groups::new(),
    }
}

/// The same tree under both filesystems: `f` (OWNER:GROUP, mode 06777),
/// `sticky/` (root, 01777) holding `theirs` (OWNER), `parent/dir` and
/// `parent/other` (OWNER, 0555 and 0777; `dir` holds `kept`, 0666), the
/// top writable by all.
fn tree(root: &Path) {
    let set = |p: &str, uid: u32, mode: u32| {
        let path = root.join(p);
        chown(&path, Some(uid), Some(GROUP)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    std::fs::write(root.join("f"), b"data").unwrap();
    set("f", OWNER, 0o6777);
    std::fs::create_dir(root.join("sticky")).unwrap();
    set("sticky", 0, 0o1777);
    std::fs::write(root.join("sticky/theirs"), b"").unwrap();
    set("sticky/theirs", OWNER, 0o666);
    std::fs::create_dir_all(root.join("parent/dir")).unwrap();
    std::fs::create_dir(root.join("parent/other")).unwrap();
    std::fs::write(root.join("parent/dir/kept"), b"kept").unwrap();
    set("parent/dir/kept", OWNER, 0o666);
    set("parent", OWNER, 0o777);
    set("parent/dir", OWNER, 0o555);
    set("parent/other", OWNER, 0o777);
    set(".", 0, 0o777);
}

/// Runs `check` on a flat export and on a stack with the tree in its layer.
fn on_both(check: impl Fn(&dyn Filesystem)) {
    if !rustix::process::geteuid().is_root() {
        layerfs_testkit::skip_or_fail(
            "callers: owners and modes",
            "giving files to other owners needs root",
        );
        return;
    }
    let flat = tempfile::tempdir().unwrap();
    tree(flat.path());
    check(&LocalFs::open(flat.path()).unwrap());
    let t = tempfile::tempdir().unwrap();
    let layer = t.path().join("layer");
    std::fs::create_dir(&layer).unwrap();
    tree(&layer);
    let upper = t.path().join("upper");
    let stack = StackFs::open_in_upper(&[layer], &upper).unwrap();
    std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(0o777)).unwrap();
    check(&stack);
}

fn at(fs: &dyn Filesystem, path: &str) -> FileId {
    let mut id = fs.root();
    for name in path.split('/') {
        id = fs
            .lookup(&Caller::root(), id, name.as_bytes())
            .unwrap()
            .fileid;
    }
    id
}

fn mode(fs: &dyn Filesystem, id: FileId) -> u32 {
    fs.getattr(id).unwrap().mode
}

#[test]
fn only_the_owner_or_root_may_chown_even_to_the_same_owner() {
    on_both(|fs| {
        let f = at(fs, "f");
        let same_owner = SetAttr {
            uid: Some(OWNER),
            ..SetAttr::default()
        };
        let same_group = SetAttr {
            gid: Some(GROUP),
            ..SetAttr::default()
        };
        assert_eq!(
            fs.setattr(&user(OTHER), f, &same_owner, None).err(),
            Some(Error::Perm)
        );
        assert_eq!(
            fs.setattr(&user(OTHER), f, &same_group, None).err(),
            Some(Error::Perm)
        );
        fs.setattr(&user(OWNER), f, &same_owner, None).unwrap();
        fs.setattr(&Caller::root(), f, &same_owner, None).unwrap();
    });
}

#[test]
fn a_write_by_an_unprivileged_caller_clears_setuid_and_setgid() {
    on_both(|fs| {
        let f = at(fs, "f");
        fs.write(&Caller::root(), f, 0, b"D", Stability::Unstable)
            .unwrap();
        assert_eq!(mode(fs, f), 0o6777, "root keeps them");
        fs.write(&user(OTHER), f, 0, b"d", Stability::Unstable)
            .unwrap();
        assert_eq!(mode(fs, f), 0o777);
    });
}

#[test]
fn chmod_by_an_owner_outside_the_group_drops_setgid() {
    on_both(|fs| {
        let f = at(fs, "f");
        let outsider = Caller {
            uid: OWNER,
            gid: 100,
            gids: layerfs_vfs::Groups::new(),
        };
        let set = SetAttr {
            mode: Some(0o2755),
            ..SetAttr::default()
        };
        fs.setattr(&outsider, f, &set, None).unwrap();
        assert_eq!(mode(fs, f), 0o755);
        fs.setattr(&user(OWNER), f, &set, None).unwrap();
        assert_eq!(mode(fs, f), 0o2755);
    });
}

#[test]
fn a_new_files_mode_is_the_one_asked_for_whatever_the_servers_umask() {
    on_both(|fs| {
        let top = fs.root();
        let long = vec![b'n'; 255];
        for (name, asked) in [(&b"short"[..], 0o620), (&long[..], 0o642)] {
            let how = Create::Guarded(SetAttr {
                mode: Some(asked),
                ..SetAttr::default()
            });
            let made = fs.create(&user(OWNER), top, name, how).unwrap().0;
            assert_eq!(made.mode, asked);
            assert_eq!(fs.getattr(made.fileid).unwrap().mode, asked);
        }
        let dir = SetAttr {
            mode: Some(0o777),
            ..SetAttr::default()
        };
        let made = fs.mkdir(&user(OWNER), top, b"d", &dir).unwrap().0;
        assert_eq!((made.kind, made.mode), (FileKind::Directory, 0o777));
    });
}

#[test]
fn a_new_file_is_its_creators_in_a_setgid_directorys_group_with_what_was_asked() {
    on_both(|fs| {
        let top = fs.root();
        let shared = SetAttr {
            mode: Some(0o2777),
            gid: Some(GROUP),
            ..SetAttr::default()
        };
        let sg = fs.mkdir(&Caller::root(), top, b"sg", &shared).unwrap().0;
        assert_eq!((sg.mode, sg.gid), (0o2777, GROUP));
        let asked = SetAttr {
            mode: Some(0o4750),
            size: Some(3),
            ..SetAttr::default()
        };
        for (dir, gid) in [(sg.fileid, GROUP), (top, OTHER)] {
            let how = Create::Unchecked(asked);
            let made = fs.create(&user(OTHER), dir, b"new", how).unwrap().0;
            let seen = (made.uid, made.gid, made.mode, made.size);
            assert_eq!(seen, (OTHER, gid, 0o4750, 3));
            let again = fs.getattr(made.fileid).unwrap();
            assert_eq!((again.uid, again.gid, again.mode, again.size), seen);
            assert_eq!((again.ctime, again.mtime), (made.ctime, made.mtime));
        }
        // Root's own file, with the mode the server's umask would give it:
        // nothing to change after the create.
        let plain = SetAttr {
            mode: Some(0o644),
            ..SetAttr::default()
        };
        let how = Create::Guarded(plain);
        let made = fs.create(&Caller::root(), top, b"root's", how).unwrap().0;
        assert_eq!((made.uid, made.gid, made.mode), (0, 0, 0o644));
    });
}

#[test]
fn moving_a_directory_to_another_parent_needs_write_permission_on_it() {
    on_both(|fs| {
        let parent = at(fs, "parent");
        let other = at(fs, "parent/other");
        let them = user(OTHER);
        // `dir` (0555) may be renamed within its parent, not moved out.
        assert_eq!(
            fs.rename(&them, parent, b"dir", other, b"dir").err(),
            Some(Error::Access)
        );
        fs.rename(&them, parent, b"dir", parent, b"dir2").unwrap();
        // A missing name is ENOENT, whatever the permissions.
        assert_eq!(
            fs.rename(&them, parent, b"missing", other, b"x").err(),
            Some(Error::NoEnt)
        );
        // Its owner may not either, without write permission on it.
        assert_eq!(
            fs.rename(&user(OWNER), parent, b"dir2", other, b"dir")
                .err(),
            Some(Error::Access)
        );
        fs.rename(&Caller::root(), parent, b"dir2", other, b"dir")
            .unwrap();
    });
}

#[test]
fn in_a_sticky_directory_only_owners_rename_or_remove() {
    on_both(|fs| {
        let sticky = at(fs, "sticky");
        let theirs = at(fs, "sticky/theirs");
        let them = user(OTHER);
        assert_eq!(
            fs.rename(&them, sticky, b"theirs", sticky, b"mine").err(),
            Some(Error::Perm)
        );
        assert_eq!(fs.remove(&them, sticky, b"theirs").err(), Some(Error::Perm));
        // Nothing moved: the name still leads to the same file.
        assert_eq!(fs.lookup(&them, sticky, b"theirs").unwrap().fileid, theirs);
        assert_eq!(fs.lookup(&them, sticky, b"mine").err(), Some(Error::NoEnt));
        fs.rename(&user(OWNER), sticky, b"theirs", sticky, b"mine")
            .unwrap();
        assert_eq!(fs.lookup(&them, sticky, b"mine").unwrap().fileid, theirs);
    });
}

#[test]
fn without_write_permission_a_missing_name_is_enoent_and_an_existing_one_eexist() {
    on_both(|fs| {
        let dir = at(fs, "parent/dir");
        let them = user(OTHER);
        assert_eq!(fs.remove(&them, dir, b"missing").err(), Some(Error::NoEnt));
        let top = fs.root();
        let set = SetAttr::default();
        assert_eq!(fs.mkdir(&them, top, b"f", &set).err(), Some(Error::Exist));
        assert_eq!(
            fs.create(&them, dir, b"new", Create::Guarded(set)).err(),
            Some(Error::Access)
        );
        // In a directory they may not write: an existing name is EEXIST for
        // every new entry, and UNCHECKED opens the file as it is.
        assert_eq!(
            fs.create(&them, dir, b"kept", Create::Guarded(set)).err(),
            Some(Error::Exist)
        );
        assert_eq!(
            fs.mkdir(&them, dir, b"kept", &set).err(),
            Some(Error::Exist)
        );
        let sym = fs.symlink(&them, dir, b"kept", b"x", &set);
        assert_eq!(sym.err(), Some(Error::Exist));
        let f = at(fs, "f");
        assert_eq!(fs.link(&them, f, dir, b"kept").err(), Some(Error::Exist));
        assert_eq!(
            fs.create(&them, dir, b"kept", Create::Exclusive([7; 8]))
                .err(),
            Some(Error::Access)
        );
        let (kept, _) = fs
            .create(&them, dir, b"kept", Create::Unchecked(set))
            .unwrap();
        assert_eq!(kept.size, 4);
    });
}
