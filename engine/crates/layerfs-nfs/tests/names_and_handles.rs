//! What a client sends that it should not: bad names, forged and stale
//! handles, escapes from the export. And handles that must keep working.

mod support;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use support::*;

#[tokio::test]
async fn bad_names_get_precise_errors() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let long = "n".repeat(256);
    let ok_long = "n".repeat(255);
    assert_eq!(
        mkdir(&mut c, &root, &long).await,
        Err(nfsstat3::NFS3ERR_NAMETOOLONG)
    );
    assert!(mkdir(&mut c, &root, &ok_long).await.is_ok());
    assert_eq!(
        lookup(&mut c, &root, &long).await.unwrap_err(),
        nfsstat3::NFS3ERR_NAMETOOLONG
    );
    for bad in ["a/b", "../x", "", "nul\0byte"] {
        let res = c
            .mkdir(&MKDIR3args {
                where_: dirop(&root, bad),
                attributes: sattr3::default(),
            })
            .await
            .unwrap();
        assert_eq!(status_of(&res), nfsstat3::NFS3ERR_INVAL, "mkdir {bad:?}");
        assert_eq!(
            lookup(&mut c, &root, bad).await.unwrap_err(),
            nfsstat3::NFS3ERR_INVAL,
            "lookup {bad:?}"
        );
    }
    for dot in [".", ".."] {
        assert_eq!(
            mkdir(&mut c, &root, dot).await,
            Err(nfsstat3::NFS3ERR_EXIST),
            "mkdir {dot}"
        );
        let res = c
            .remove(&REMOVE3args {
                object: dirop(&root, dot),
            })
            .await
            .unwrap();
        assert_ne!(status_of(&res), nfsstat3::NFS3_OK, "remove {dot}");
        let res = c
            .rename(&RENAME3args {
                from: dirop(&root, dot),
                to: dirop(&root, "z"),
            })
            .await
            .unwrap();
        assert_eq!(status_of(&res), nfsstat3::NFS3ERR_INVAL, "rename {dot}");
    }
    let res = c
        .rmdir(&RMDIR3args {
            object: dirop(&root, "."),
        })
        .await
        .unwrap();
    assert_eq!(status_of(&res), nfsstat3::NFS3ERR_INVAL);
}

#[tokio::test]
async fn dot_dot_at_the_root_stays_at_the_root() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let (up, _) = lookup(&mut c, &root, "..").await.unwrap();
    assert_eq!(up, root);
    let sub = mkdir(&mut c, &root, "sub").await.unwrap();
    let (up, _) = lookup(&mut c, &sub, "..").await.unwrap();
    assert_eq!(up, root);
    let (same, _) = lookup(&mut c, &sub, ".").await.unwrap();
    assert_eq!(same, sub);
}

#[tokio::test]
async fn symlinks_are_never_followed_by_the_server() {
    let server = TestServer::start();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"outside the export").unwrap();
    std::os::unix::fs::symlink(outside.path(), server.path("escape")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), server.path("secret-link")).unwrap();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let (esc, attr) = lookup(&mut c, &root, "escape").await.unwrap();
    assert_eq!(attr.type_, ftype3::NF3LNK);
    // LOOKUP through a symlink is not a directory lookup.
    assert_eq!(
        lookup(&mut c, &esc, "secret").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOTDIR
    );
    let (link, _) = lookup(&mut c, &root, "secret-link").await.unwrap();
    let res = c
        .read(&READ3args {
            file: link.clone(),
            offset: 0,
            count: 100,
        })
        .await
        .unwrap();
    assert_eq!(
        status_of(&res),
        nfsstat3::NFS3ERR_INVAL,
        "READ of a symlink does not read its target"
    );
    let res = c
        .write(&WRITE3args {
            file: link,
            offset: 0,
            count: 1,
            stable: stable_how::FILE_SYNC,
            data: Opaque::borrowed(b"x"),
        })
        .await
        .unwrap();
    assert_ne!(status_of(&res), nfsstat3::NFS3_OK);
    assert_eq!(
        std::fs::read(outside.path().join("secret")).unwrap(),
        b"outside the export"
    );
    let res = c
        .create(&CREATE3args {
            where_: dirop(&esc, "planted"),
            how: createhow3::UNCHECKED(sattr3::default()),
        })
        .await
        .unwrap();
    assert_ne!(status_of(&res), nfsstat3::NFS3_OK);
    assert!(!outside.path().join("planted").exists());
}

#[tokio::test]
async fn forged_truncated_and_foreign_handles_are_refused() {
    let server = TestServer::start();
    let other = TestServer::start();
    let mut c = mount(server.port()).await;
    let mut c2 = mount(other.port()).await;
    let root = c.root_nfs_fh3();
    let fh = create(&mut c, &root, "f").await;
    let bad = |bytes: Vec<u8>| nfs_fh3 {
        data: Opaque::owned(bytes),
    };
    assert_eq!(
        getattr(&mut c, &bad(vec![])).await.unwrap_err(),
        nfsstat3::NFS3ERR_BADHANDLE
    );
    assert_eq!(
        getattr(&mut c, &bad(vec![0xAB; 64])).await.unwrap_err(),
        nfsstat3::NFS3ERR_BADHANDLE
    );
    assert_eq!(
        getattr(&mut c, &bad(fh.data[..10].to_vec()))
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_BADHANDLE
    );
    // A handle changed to name another file id, or another generation of
    // the file: its MAC no longer holds.
    let mut forged = fh.data.to_vec();
    forged[9..17].copy_from_slice(&u64::MAX.to_be_bytes());
    assert_eq!(
        getattr(&mut c, &bad(forged)).await.unwrap_err(),
        nfsstat3::NFS3ERR_BADHANDLE
    );
    let mut regen = fh.data.to_vec();
    regen[24] ^= 1;
    assert_eq!(
        getattr(&mut c, &bad(regen)).await.unwrap_err(),
        nfsstat3::NFS3ERR_BADHANDLE
    );
    // Another export's handle, signed with the same key (one store).
    assert_eq!(
        getattr(&mut c2, &fh).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
    // A handle longer than NFSv3 allows is refused too.
    let res = c
        .getattr(&GETATTR3args {
            object: bad(vec![1; 65]),
        })
        .await;
    assert!(res
        .map(|r| status_of(&r) != nfsstat3::NFS3_OK)
        .unwrap_or(true));
}

#[tokio::test]
async fn a_deleted_and_replaced_file_is_stale() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let old = create(&mut c, &root, "f").await;
    c.remove(&REMOVE3args {
        object: dirop(&root, "f"),
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        getattr(&mut c, &old).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
    let new = create(&mut c, &root, "f").await;
    assert_ne!(new, old);
    assert_eq!(
        getattr(&mut c, &old).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
}

#[tokio::test]
async fn handles_survive_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (deep, file) = {
        let handle = serve(dir.path());
        let mut c = mount(handle.local_addr().port()).await;
        let root = c.root_nfs_fh3();
        let a = mkdir(&mut c, &root, "a").await.unwrap();
        let b = mkdir(&mut c, &a, "b").await.unwrap();
        let f = create(&mut c, &b, "file").await;
        write(&mut c, &f, 0, b"kept", stable_how::FILE_SYNC).await;
        (b, f)
    };
    // A new server over the same directory: it has never seen these handles.
    let handle = serve(dir.path());
    let mut c = mount(handle.local_addr().port()).await;
    assert_eq!(getattr(&mut c, &file).await.unwrap().size, 4);
    let (data, _) = read(&mut c, &file, 0, 10).await;
    assert_eq!(data, b"kept");
    let (again, _) = lookup(&mut c, &deep, "file").await.unwrap();
    assert_eq!(again, file);
}
