//! The layer store: imports from directories and tarballs, digests, whiteouts,
//! hostile archives, and crash leftovers.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use layerfs_layers::{Store, OPAQUE_MARKER};
use layerfs_testkit::{or_skip, CrossOverlay};

/// A small image layer: files, a symlink, a whiteout and an opaque directory.
fn sample_tree(dir: &Path) {
    fs::create_dir_all(dir.join("etc/conf.d")).unwrap();
    fs::write(dir.join("etc/hostname"), b"layerfs\n").unwrap();
    fs::write(dir.join("etc/conf.d/a"), vec![7u8; 100_000]).unwrap();
    fs::set_permissions(dir.join("etc/conf.d/a"), fs::Permissions::from_mode(0o600)).unwrap();
    symlink("hostname", dir.join("etc/name")).unwrap();
    fs::write(dir.join("etc/.wh.removed"), b"").unwrap();
    fs::create_dir(dir.join("opaque")).unwrap();
    fs::write(dir.join("opaque").join(OPAQUE_MARKER), b"").unwrap();
}

fn tar_of(dir: &Path, gzip: bool, out: &Path) {
    let file = fs::File::create(out).unwrap();
    let writer: Box<dyn Write> = if gzip {
        Box::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::fast(),
        ))
    } else {
        Box::new(file)
    };
    let mut builder = tar::Builder::new(writer);
    builder.follow_symlinks(false);
    builder.append_dir_all(".", dir).unwrap();
    builder.into_inner().unwrap().flush().unwrap();
}

#[test]
fn the_same_content_gets_the_same_id_however_it_arrives() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    sample_tree(&src);
    let store = Store::open(&work.path().join("store")).unwrap();
    let from_dir = store.import_dir(&src).unwrap();
    assert_eq!(store.import_dir(&src).unwrap(), from_dir, "importing twice");
    tar_of(&src, false, &work.path().join("l.tar"));
    tar_of(&src, true, &work.path().join("l.tar.gz"));
    assert_eq!(
        store.import_tar(&work.path().join("l.tar")).unwrap(),
        from_dir
    );
    assert_eq!(
        store.import_tar(&work.path().join("l.tar.gz")).unwrap(),
        from_dir
    );
    assert_eq!(
        store.layers().unwrap(),
        vec![from_dir.clone()],
        "one layer, stored once"
    );

    let layer = store.layer_dir(&from_dir);
    assert_eq!(fs::read(layer.join("etc/hostname")).unwrap(), b"layerfs\n");
    assert_eq!(
        fs::read_link(layer.join("etc/name")).unwrap().to_str(),
        Some("hostname")
    );
    assert!(
        layer.join("etc/.wh.removed").is_file(),
        "whiteouts are kept as they are"
    );
    assert!(layer.join("opaque").join(OPAQUE_MARKER).is_file());
    let mode = fs::metadata(layer.join("etc/conf.d/a"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn different_content_gets_a_different_id() {
    let work = tempfile::tempdir().unwrap();
    let store = Store::open(&work.path().join("store")).unwrap();
    let a = work.path().join("a");
    fs::create_dir(&a).unwrap();
    sample_tree(&a);
    let first = store.import_dir(&a).unwrap();
    fs::write(a.join("etc/hostname"), b"other\n").unwrap();
    let second = store.import_dir(&a).unwrap();
    assert_ne!(first, second);
    fs::set_permissions(a.join("etc/hostname"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_ne!(
        store.import_dir(&a).unwrap(),
        second,
        "permission bits count"
    );
    assert_eq!(store.layers().unwrap().len(), 3);
}

#[test]
fn a_tarball_escaping_the_layer_is_refused_and_leaves_nothing() {
    let work = tempfile::tempdir().unwrap();
    let store = Store::open(&work.path().join("store")).unwrap();
    let evil = work.path().join("evil.tar");
    {
        let mut builder = tar::Builder::new(fs::File::create(&evil).unwrap());
        let mut header = tar::Header::new_gnu();
        let data = b"pwned";
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        // Written raw: the builder itself refuses such names.
        header.as_gnu_mut().unwrap().name[..12].copy_from_slice(b"../../escape");
        header.set_cksum();
        builder.append(&header, &data[..]).unwrap();
        builder.finish().unwrap();
    }
    let err = store.import_tar(&evil).unwrap_err();
    assert!(err.to_string().contains("outside the layer"), "{err}");
    assert!(!work.path().join("escape").exists());
    assert!(store.layers().unwrap().is_empty());
    assert_eq!(
        fs::read_dir(work.path().join("store/staging"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn leftovers_of_an_interrupted_import_are_cleared_on_open() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("store");
    drop(Store::open(&root).unwrap());
    fs::create_dir_all(root.join("staging/123-0/half")).unwrap();
    let store = Store::open(&root).unwrap();
    assert_eq!(fs::read_dir(root.join("staging")).unwrap().count(), 0);
    assert!(store.layers().unwrap().is_empty());
}

#[test]
fn a_truncated_tarball_is_an_error_not_a_layer() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    sample_tree(&src);
    let full = work.path().join("l.tar");
    tar_of(&src, false, &full);
    let bytes = fs::read(&full).unwrap();
    let cut = work.path().join("cut.tar");
    fs::write(&cut, &bytes[..bytes.len() / 2 + 100]).unwrap();
    let store = Store::open(&work.path().join("store")).unwrap();
    assert!(store.import_tar(&cut).is_err());
    assert!(store.layers().unwrap().is_empty());
    assert_eq!(
        fs::read_dir(work.path().join("store/staging"))
            .unwrap()
            .count(),
        0
    );
}

/// A tar entry written raw: the `tar` crate's builder refuses names and link
/// targets that climb out of the archive.
fn raw_entry(kind: tar::EntryType, name: &str, link: &str, data: &[u8]) -> (tar::Header, Vec<u8>) {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
    header.set_entry_type(kind);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    let gnu = header.as_gnu_mut().unwrap();
    gnu.name[..name.len()].copy_from_slice(name.as_bytes());
    gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
    header.set_cksum();
    (header, data.to_vec())
}

#[test]
fn a_tarball_reaching_out_through_links_is_refused_with_the_entry_named() {
    use tar::EntryType::{Directory, Link, Regular, Symlink};
    let work = tempfile::tempdir().unwrap();
    let outside = work.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"kept").unwrap();
    let out = outside.display().to_string();
    let secret = format!("{out}/secret");
    let cases: Vec<(&str, Vec<_>, &str, &str)> = vec![
        (
            "a file through a symlink to a directory outside",
            vec![
                raw_entry(Symlink, "a", &out, b""),
                raw_entry(Regular, "a/new", "", b"x"),
            ],
            "a/new",
            "would land outside the layer",
        ),
        (
            "a file through a relative symlink climbing out",
            vec![
                raw_entry(Directory, "d", "", b""),
                raw_entry(Symlink, "d/up", "../../../../../../..", b""),
                raw_entry(Regular, "d/up/new", "", b"x"),
            ],
            "d/up/new",
            "would land outside the layer",
        ),
        (
            "a hard link to a file outside",
            vec![raw_entry(Link, "h", &secret, b"")],
            "h",
            "would land outside the layer",
        ),
        (
            "a hard link through a symlink",
            vec![
                raw_entry(Symlink, "s", &out, b""),
                raw_entry(Link, "h", "s/secret", b""),
            ],
            "h",
            "would land outside the layer",
        ),
        (
            "a hard link to a name the archive never made",
            vec![raw_entry(Link, "h", "missing", b"")],
            "h",
            "cannot be unpacked",
        ),
    ];
    let store = Store::open(&work.path().join("store")).unwrap();
    for (what, entries, name, why) in cases {
        let tarball = work.path().join("evil.tar");
        let mut builder = tar::Builder::new(fs::File::create(&tarball).unwrap());
        for (header, data) in entries {
            builder.append(&header, &data[..]).unwrap();
        }
        builder.finish().unwrap();
        drop(builder);
        let err = store.import_tar(&tarball).unwrap_err().to_string();
        assert!(
            err.contains(&format!("entry {name:?} {why}")),
            "{what}: {err}"
        );
        assert!(
            !err.contains("staging"),
            "{what}: the message names the store's insides: {err}"
        );
        assert_eq!(fs::read(outside.join("secret")).unwrap(), b"kept", "{what}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 1, "{what}");
        assert!(store.layers().unwrap().is_empty(), "{what}");
        let staging = work.path().join("store/staging");
        assert_eq!(fs::read_dir(staging).unwrap().count(), 0, "{what}");
    }
}

#[test]
fn a_file_that_is_no_tarball_is_refused_as_one() {
    let work = tempfile::tempdir().unwrap();
    let junk = work.path().join("junk.tar");
    fs::write(&junk, b"hello world ".repeat(100)).unwrap();
    let store = Store::open(&work.path().join("store")).unwrap();
    let err = store.import_tar(&junk).unwrap_err();
    assert!(err.to_string().starts_with("not a tar archive"), "{err}");
    assert!(store.layers().unwrap().is_empty());
}

#[test]
fn a_store_on_a_filesystem_that_renumbers_files_is_refused_before_anything_is_made() {
    let ov = CrossOverlay::new(|_| {});
    let Some(ov) = or_skip(ov, "an overlay across filesystems") else {
        return;
    };
    let root = ov.merged().join("store");
    let err = Store::open(&root)
        .err()
        .expect("a store whose workspaces could never be served was opened");
    assert!(
        err.to_string().contains("does not keep inode numbers"),
        "{err}"
    );
    assert!(!root.exists(), "the store was made before the refusal");
    // The same path one filesystem down is a store.
    assert!(Store::open(&ov.beside().join("store")).is_ok());
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    rustix::fs::lgetxattr(path, name, &mut buf[..])
        .ok()
        .map(|n| buf[..n].to_vec())
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty()).unwrap();
}

fn mtime_ns(path: &Path) -> (i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(path).unwrap();
    (m.mtime(), m.mtime_nsec())
}

/// What a tarball carries beyond files: devices and FIFOs (as root, the
/// only caller who can make a device), PAX extended attributes on files and
/// directories, nanosecond times, and hard links.
#[test]
fn a_tarball_keeps_devices_fifos_xattrs_links_and_nanoseconds() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular};
    if !rustix::process::geteuid().is_root() {
        return layerfs_testkit::skip_or_fail("tarball devices", "device nodes need root");
    }
    let work = tempfile::tempdir().unwrap();
    let tarball = work.path().join("image.tar");
    let mut builder = tar::Builder::new(fs::File::create(&tarball).unwrap());
    let pax = |builder: &mut tar::Builder<fs::File>, records: &[(&str, &[u8])]| {
        builder
            .append_pax_extensions(records.iter().map(|(k, v)| (*k, *v)))
            .unwrap();
    };
    pax(&mut builder, &[("SCHILY.xattr.user.dir", b"d")]);
    let (h, d) = raw_entry(Directory, "etc", "", b"");
    builder.append(&h, &d[..]).unwrap();
    pax(
        &mut builder,
        &[
            ("SCHILY.xattr.user.origin", b"image"),
            ("mtime", b"1700000000.123456789"),
        ],
    );
    let (h, d) = raw_entry(Regular, "etc/file", "", b"data");
    builder.append(&h, &d[..]).unwrap();
    let (h, d) = raw_entry(Link, "etc/again", "etc/file", b"");
    builder.append(&h, &d[..]).unwrap();
    for (kind, name) in [(Char, "null"), (Block, "disk"), (Fifo, "pipe")] {
        let (mut header, data) = raw_entry(kind, name, "", b"");
        header.set_device_major(1).unwrap();
        header.set_device_minor(3).unwrap();
        header.set_cksum();
        builder.append(&header, &data[..]).unwrap();
    }
    builder.finish().unwrap();
    drop(builder);
    let store = Store::open(&work.path().join("store")).unwrap();
    let id = store.import_tar(&tarball).unwrap();
    let layer = store.layer_dir(&id);
    let kind = |name: &str| fs::symlink_metadata(layer.join(name)).unwrap();
    assert!(kind("null").file_type().is_char_device());
    assert!(kind("disk").file_type().is_block_device());
    assert!(kind("pipe").file_type().is_fifo());
    assert_eq!(kind("null").rdev(), rustix::fs::makedev(1, 3));
    assert_eq!(kind("etc/file").ino(), kind("etc/again").ino());
    assert_eq!(
        xattr(&layer.join("etc/file"), "user.origin").as_deref(),
        Some(&b"image"[..])
    );
    assert_eq!(
        xattr(&layer.join("etc"), "user.dir").as_deref(),
        Some(&b"d"[..])
    );
    assert_eq!(
        mtime_ns(&layer.join("etc/file")),
        (1_700_000_000, 123_456_789)
    );
}

/// A directory import keeps what the tree holds: FIFOs, devices (as root),
/// hard links, extended attributes (a `security.` label of the host is
/// not the layer's), nanosecond times of files and directories; a socket
/// is skipped. Two trees that differ only in an attribute are two layers.
#[test]
fn a_directory_import_keeps_fifos_devices_xattrs_links_and_times() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::write(src.join("dir/file"), b"data").unwrap();
    fs::hard_link(src.join("dir/file"), src.join("link")).unwrap();
    set_xattr(&src.join("dir/file"), "user.origin", b"host");
    set_xattr(&src.join("dir"), "user.dir", b"d");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    let as_root = rustix::process::geteuid().is_root();
    if as_root {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            src.join("null"),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 3),
        )
        .unwrap();
    }
    let _socket = std::os::unix::net::UnixListener::bind(src.join("socket")).unwrap();
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 1,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: 987_654_321,
        },
    };
    for name in ["dir/file", "dir"] {
        rustix::fs::utimensat(
            rustix::fs::CWD,
            src.join(name),
            &times,
            rustix::fs::AtFlags::empty(),
        )
        .unwrap();
    }
    let store = Store::open(&work.path().join("store")).unwrap();
    let id = store.import_dir(&src).unwrap();
    let layer = store.layer_dir(&id);
    let meta = |name: &str| fs::symlink_metadata(layer.join(name)).unwrap();
    assert!(meta("fifo").file_type().is_fifo());
    assert_eq!(meta("fifo").mode() & 0o7777, 0o640);
    if as_root {
        assert!(meta("null").file_type().is_char_device());
        assert_eq!(meta("null").rdev(), rustix::fs::makedev(1, 3));
    }
    assert!(!layer.join("socket").exists(), "a socket in a layer");
    assert_eq!(meta("dir/file").ino(), meta("link").ino());
    assert_eq!(
        xattr(&layer.join("dir/file"), "user.origin").as_deref(),
        Some(&b"host"[..])
    );
    assert_eq!(
        xattr(&layer.join("dir"), "user.dir").as_deref(),
        Some(&b"d"[..])
    );
    assert_eq!(
        mtime_ns(&layer.join("dir/file")),
        (1_600_000_000, 987_654_321)
    );
    assert_eq!(mtime_ns(&layer.join("dir")), (1_600_000_000, 987_654_321));
    assert_eq!(store.import_dir(&src).unwrap(), id, "the same tree twice");
    set_xattr(&src.join("dir/file"), "user.origin", b"elsewhere");
    assert_ne!(
        store.import_dir(&src).unwrap(),
        id,
        "an attribute changed, the id did not"
    );
}

/// A caller who is not root cannot make a device node; the import says so,
/// naming the entry, and leaves nothing behind. A FIFO and a `user.`
/// attribute are kept for such a caller all the same. Run as root, the test
/// runs itself again as uid 65534.
#[test]
fn a_user_keeps_fifos_and_xattrs_and_is_told_why_a_device_is_refused() {
    use std::os::unix::fs::FileTypeExt;
    const INNER: &str = "LAYERFS_STORE_TEST_AS_USER";
    if rustix::process::geteuid().is_root() {
        if std::process::Command::new("setpriv")
            .arg("--version")
            .output()
            .is_err()
        {
            return layerfs_testkit::skip_or_fail("imports as a user", "setpriv is missing");
        }
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_user_keeps_fifos_and_xattrs_and_is_told_why_a_device_is_refused",
                "--nocapture",
            ])
            .env(INNER, "1")
            .env("TMPDIR", "/tmp")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "as uid 65534:\n{text}");
        assert!(text.contains("1 passed"), "{text}");
        return;
    }
    assert!(std::env::var_os(INNER).is_some() || !rustix::process::geteuid().is_root());
    let work = tempfile::tempdir().unwrap();
    let tarball = work.path().join("dev.tar");
    let mut builder = tar::Builder::new(fs::File::create(&tarball).unwrap());
    let (mut header, data) = raw_entry(tar::EntryType::Char, "dev/null", "", b"");
    header.set_device_major(1).unwrap();
    header.set_device_minor(3).unwrap();
    header.set_cksum();
    builder.append(&header, &data[..]).unwrap();
    builder.finish().unwrap();
    drop(builder);
    let store = Store::open(&work.path().join("store")).unwrap();
    let err = store.import_tar(&tarball).unwrap_err().to_string();
    assert!(
        err.contains("entry \"dev/null\"") && err.contains("root"),
        "{err}"
    );
    assert!(store.layers().unwrap().is_empty());

    let src = work.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("file"), b"x").unwrap();
    set_xattr(&src.join("file"), "user.kept", b"yes");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let id = store.import_dir(&src).unwrap();
    let layer = store.layer_dir(&id);
    assert!(fs::symlink_metadata(layer.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(
        xattr(&layer.join("file"), "user.kept").as_deref(),
        Some(&b"yes"[..])
    );
}

/// A sparse file GNU tar archives in each PAX sparse version comes out as
/// the file it describes, under its own name, with its holes kept.
#[test]
fn a_pax_sparse_file_of_each_version_is_unpacked_whole_with_its_holes() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    if std::process::Command::new("tar")
        .arg("--version")
        .output()
        .is_err()
    {
        return layerfs_testkit::skip_or_fail("PAX sparse files", "GNU tar is missing");
    }
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    let holey = src.join("dir/holey");
    let file = fs::File::create(&holey).unwrap();
    file.set_len(8 << 20).unwrap();
    file.write_all_at(b"at the start", 0).unwrap();
    file.write_all_at(&[9u8; 70_000], 3 << 20).unwrap();
    file.write_all_at(b"near the end", (8 << 20) - 100).unwrap();
    drop(file);
    let want = fs::read(&holey).unwrap();
    // The directory's own import, in a store of its own: the same id in
    // the same store would be the same layer, not unpacked again.
    let plain = Store::open(&work.path().join("plain"))
        .unwrap()
        .import_dir(&src)
        .unwrap();
    for version in ["0.0", "0.1", "1.0"] {
        let store = Store::open(&work.path().join(format!("store-{version}"))).unwrap();
        let tarball = work.path().join(format!("sparse-{version}.tar"));
        let made = std::process::Command::new("tar")
            .args([
                "--sparse",
                "--format=posix",
                &format!("--sparse-version={version}"),
            ])
            .arg("-C")
            .arg(&src)
            .arg("-cf")
            .arg(&tarball)
            .arg(".")
            .status()
            .unwrap();
        assert!(made.success(), "tar --sparse-version={version}");
        let id = store.import_tar(&tarball).unwrap();
        assert_eq!(
            id, plain,
            "version {version}: the same tree as the directory's"
        );
        let layer = store.layer_dir(&id);
        let names: Vec<_> = fs::read_dir(layer.join("dir"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["holey"], "version {version}");
        let got = layer.join("dir/holey");
        assert!(
            fs::read(&got).unwrap() == want,
            "version {version}: its bytes"
        );
        let meta = fs::metadata(&got).unwrap();
        assert!(
            meta.blocks() * 512 < 1 << 20,
            "version {version}: {} bytes allocated for 8 MiB with 70 kB of data",
            meta.blocks() * 512
        );
    }
}

/// `umoci repack` writes a directory turned into a file as the file and
/// then a whiteout under it: the whiteout has nothing to hide.
#[test]
fn a_whiteout_under_a_file_of_its_own_layer_is_dropped() {
    let work = tempfile::tempdir().unwrap();
    let tarball = work.path().join("d2f.tar");
    let mut builder = tar::Builder::new(fs::File::create(&tarball).unwrap());
    for (kind, name, data) in [
        (tar::EntryType::Regular, "d2f", &b"now a file"[..]),
        (tar::EntryType::Regular, "d2f/.wh.inner", b""),
        (tar::EntryType::Regular, "kept", b"kept"),
    ] {
        let (header, data) = raw_entry(kind, name, "", data);
        builder.append(&header, &data[..]).unwrap();
    }
    builder.into_inner().unwrap();
    let store = Store::open(&work.path().join("store")).unwrap();
    let id = store.import_tar(&tarball).unwrap();
    let layer = store.layer_dir(&id);
    assert_eq!(fs::read(layer.join("d2f")).unwrap(), b"now a file");
    assert_eq!(fs::read(layer.join("kept")).unwrap(), b"kept");
    // Elsewhere a path through a file is still an error.
    let bad = work.path().join("through-a-file.tar");
    let mut builder = tar::Builder::new(fs::File::create(&bad).unwrap());
    for (name, data) in [("f", &b"a file"[..]), ("f/inside", b"x")] {
        let (header, data) = raw_entry(tar::EntryType::Regular, name, "", data);
        builder.append(&header, &data[..]).unwrap();
    }
    builder.into_inner().unwrap();
    let err = store.import_tar(&bad).unwrap_err().to_string();
    assert!(err.contains("f/inside"), "{err}");
}

/// `umoci insert` ends a layer right after its last entry's data, without
/// the padding and end blocks: taken as whole while that data is; a stream
/// that ends inside it is refused.
#[test]
fn a_stream_ending_right_after_its_last_entrys_data_is_taken_and_one_cut_inside_it_is_not() {
    let work = tempfile::tempdir().unwrap();
    let whole = work.path().join("whole.tar");
    let mut builder = tar::Builder::new(Vec::new());
    let last_data = b"the last entry, 33 bytes of data.";
    for (name, data) in [("first", &b"first"[..]), ("last", &last_data[..])] {
        let (header, data) = raw_entry(tar::EntryType::Regular, name, "", data);
        builder.append(&header, &data[..]).unwrap();
    }
    let bytes = builder.into_inner().unwrap();
    fs::write(&whole, &bytes).unwrap();
    // 3 blocks of headers and data, then the last entry's data.
    let data_end = 3 * 512 + last_data.len();
    let store = Store::open(&work.path().join("store")).unwrap();
    let want = store.import_tar(&whole).unwrap();
    let unpadded = work.path().join("unpadded.tar");
    fs::write(&unpadded, &bytes[..data_end]).unwrap();
    assert_eq!(store.import_tar(&unpadded).unwrap(), want);
    let padded = work.path().join("no-end-blocks.tar");
    fs::write(&padded, &bytes[..4 * 512]).unwrap();
    assert_eq!(store.import_tar(&padded).unwrap(), want);
    let cut = work.path().join("cut.tar");
    fs::write(&cut, &bytes[..data_end - 1]).unwrap();
    let err = store.import_tar(&cut).unwrap_err().to_string();
    assert!(err.contains("ends inside the data of \"last\""), "{err}");
}

/// A blob that is not a tar archive (a gzip stream where a plain tar was
/// expected, say) is refused in one line of printable characters.
#[test]
fn a_blob_that_is_no_tar_is_refused_in_one_printable_line() {
    let work = tempfile::tempdir().unwrap();
    let junk = work.path().join("junk.tar");
    let mut bytes: Vec<u8> = (0..2048u32).map(|i| (i * 7 % 256) as u8).collect();
    bytes[..4].copy_from_slice(&[0x1f, 0x8b, 0x08, 0x00]);
    bytes[100..108].copy_from_slice(b"\n\x07\x1b[31m\n");
    fs::write(&junk, &bytes).unwrap();
    let store = Store::open(&work.path().join("store")).unwrap();
    let err = store.import_tar(&junk).unwrap_err().to_string();
    assert!(err.starts_with("not a tar archive"), "{err}");
    assert!(
        !err.chars().any(|c| c.is_control() || c == '\u{fffd}'),
        "{err:?}"
    );
}
