//! A layered workspace served over NFS: handles of lower files survive
//! copy-up, commit and restarts.

mod support;

use std::path::Path;

use layerfs_layers::Workspace;
use nfs3_types::nfs3::*;
use support::*;

/// Three layers: `base` holds `keep` and `dir/deep`; `mid` replaces
/// `replaced` and whites out `gone`; `top` adds `top-only`.
fn layers(root: &Path) -> Vec<std::path::PathBuf> {
    let l = |n: &str| {
        let p = root.join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let (base, mid, top) = (l("base"), l("mid"), l("top"));
    std::fs::write(base.join("keep"), b"base data").unwrap();
    std::fs::write(base.join("replaced"), b"old").unwrap();
    std::fs::write(base.join("gone"), b"hidden").unwrap();
    std::fs::create_dir(base.join("dir")).unwrap();
    std::fs::write(base.join("dir/deep"), b"deep").unwrap();
    std::fs::write(mid.join("replaced"), b"new").unwrap();
    std::fs::write(mid.join(".wh.gone"), b"").unwrap();
    std::fs::write(top.join("top-only"), b"top").unwrap();
    vec![base, mid, top]
}

#[tokio::test(flavor = "current_thread")]
async fn handles_taken_before_copy_up_and_commit_keep_working() {
    let t = tempfile::tempdir().unwrap();
    let stack = layers(t.path());
    let ws = Workspace::create(&t.path().join("ws"), &stack).unwrap();
    let server = serve_fs(ws.fs(), &t.path().join("ws"));
    let port = server.local_addr().port();
    let mut c = mount(port).await;
    let root = c.root_nfs_fh3();

    assert_eq!(
        lookup(&mut c, &root, "gone").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );
    assert_eq!(
        lookup(&mut c, &root, ".wh.gone").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );
    let mut names = list_names(&mut c, &root, 4096).await;
    names.sort();
    assert_eq!(names, [".", "..", "dir", "keep", "replaced", "top-only"]);
    let (replaced, _) = lookup(&mut c, &root, "replaced").await.unwrap();
    assert_eq!(read(&mut c, &replaced, 0, 100).await.0, b"new");

    // Handles of a lower file and a lower directory, then a write: copy-up.
    let (keep, before) = lookup(&mut c, &root, "keep").await.unwrap();
    let (dir, dir_before) = lookup(&mut c, &root, "dir").await.unwrap();
    write(&mut c, &keep, 0, b"BASE", stable_how::FILE_SYNC).await;
    let after = getattr(&mut c, &keep).await.unwrap();
    assert_eq!(
        after.fileid, before.fileid,
        "copy-up changed the inode number"
    );
    assert_eq!(read(&mut c, &keep, 0, 100).await.0, b"BASE data");
    create(&mut c, &dir, "new").await;
    assert_eq!(
        getattr(&mut c, &dir).await.unwrap().fileid,
        dir_before.fileid
    );
    assert_eq!(
        std::fs::read(stack[0].join("keep")).unwrap(),
        b"base data",
        "a layer changed"
    );

    // Commit while served: the same handles, the same data.
    let committed = ws.commit(&[]).unwrap();
    assert_eq!(std::fs::read(committed.join("keep")).unwrap(), b"BASE data");
    assert_eq!(getattr(&mut c, &keep).await.unwrap().fileid, before.fileid);
    assert_eq!(read(&mut c, &keep, 0, 100).await.0, b"BASE data");
    let (_, new_attr) = lookup(&mut c, &dir, "new").await.unwrap();
    // And a copy-up out of the committed layer keeps them too.
    write(&mut c, &keep, 9, b"!", stable_how::FILE_SYNC).await;
    assert_eq!(read(&mut c, &keep, 0, 100).await.0, b"BASE data!");
    assert_eq!(getattr(&mut c, &keep).await.unwrap().fileid, before.fileid);
    assert_eq!(
        std::fs::read(committed.join("keep")).unwrap(),
        b"BASE data",
        "a layer changed"
    );
    // The map is held while the workspace is open.
    let busy = Workspace::open(&t.path().join("ws")).err().unwrap();
    assert!(busy.to_string().contains("already served"), "{busy}");
    drop(c);
    drop(server);
    drop(ws);

    // After a restart, from what was persisted (once the server's threads
    // have let go of the workspace).
    let mut again = Workspace::open(&t.path().join("ws"));
    for _ in 0..100 {
        if again.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        again = Workspace::open(&t.path().join("ws"));
    }
    let again = again.unwrap();
    let server = serve_fs(again.fs(), &t.path().join("ws"));
    let mut c = mount(server.local_addr().port()).await;
    assert_eq!(getattr(&mut c, &keep).await.unwrap().fileid, before.fileid);
    assert_eq!(read(&mut c, &keep, 0, 100).await.0, b"BASE data!");
    let root = c.root_nfs_fh3();
    let (_, still) = lookup(&mut c, &dir, "new").await.unwrap();
    assert_eq!(still.fileid, new_attr.fileid);
    assert!(lookup(&mut c, &root, "top-only").await.is_ok());

    // Another workspace on the committed stack sees the committed tree.
    let other = Workspace::create(&t.path().join("other"), &again.layers()).unwrap();
    let server = serve_fs(other.fs(), &t.path().join("other"));
    let mut c = mount(server.local_addr().port()).await;
    let root = c.root_nfs_fh3();
    let (keep2, _) = lookup(&mut c, &root, "keep").await.unwrap();
    assert_eq!(read(&mut c, &keep2, 0, 100).await.0, b"BASE data");
}
