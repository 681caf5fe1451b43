//! The layer store: imports from directories and tarballs, digests, whiteouts,
//! hostile archives, and crash leftovers.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use layerfs_layers::{Store, OPAQUE_MARKER};

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
