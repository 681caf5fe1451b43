//! Every NFSv3 and MOUNT procedure through a client no one here wrote
//! (`nfs3_client`), against a server over a temporary directory.

mod support;

use std::os::unix::fs::MetadataExt;

use nfs3_types::mount::dirpath;
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use support::*;

#[tokio::test]
async fn mount_null_getattr_fsinfo_fsstat_pathconf() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    c.null().await.unwrap();
    let root = c.root_nfs_fh3();
    assert!(root.data.len() <= 64);
    let attr = getattr(&mut c, &root).await.unwrap();
    assert_eq!(attr.type_, ftype3::NF3DIR);
    assert_eq!(
        attr.fileid,
        std::fs::metadata(server.dir.path()).unwrap().ino()
    );

    let info = c
        .fsinfo(&FSINFO3args {
            fsroot: root.clone(),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((info.rtmax, info.wtmax), (1 << 20, 1 << 20));
    assert!(info.rtpref > 0 && info.wtpref > 0 && info.dtpref > 0);
    assert_eq!(info.properties, 0x1b, "LINK|SYMLINK|HOMOGENEOUS|CANSETTIME");
    assert_eq!(
        info.time_delta,
        nfstime3 {
            seconds: 0,
            nseconds: 1
        }
    );
    assert!(info.maxfilesize >= 1 << 40);

    let stat = c
        .fsstat(&FSSTAT3args {
            fsroot: root.clone(),
        })
        .await
        .unwrap()
        .unwrap();
    assert!(stat.tbytes >= stat.fbytes && stat.fbytes >= stat.abytes && stat.tbytes > 0);

    let conf = c
        .pathconf(&PATHCONF3args {
            object: root.clone(),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(conf.name_max, 255);
    assert!(conf.no_trunc && conf.case_preserving && !conf.case_insensitive);
}

#[tokio::test]
async fn mount_program_procedures() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    c.mount_client.null().await.unwrap();
    let exports = c.mount_client.export().await.unwrap();
    assert_eq!(exports.0.len(), 1);
    assert_eq!(exports.0[0].ex_dir.0.as_ref(), b"/");
    let dump = c.mount_client.dump().await.unwrap();
    assert_eq!(dump.0.len(), 1, "the MNT of this connection");
    // Mounting by the export's host path gives the same root.
    let by_path = server.dir.path().to_str().unwrap().to_string();
    let res = c
        .mount_client
        .mnt(dirpath(Opaque::owned(by_path.into_bytes())))
        .await
        .unwrap();
    assert_eq!(res.fhandle.0.as_ref(), c.root_nfs_fh3().data.as_ref());
    let unknown = c
        .mount_client
        .mnt(dirpath(Opaque::borrowed(b"/elsewhere")))
        .await;
    assert!(
        unknown.is_err(),
        "MNT of an unknown path fails: {unknown:?}"
    );
    c.mount_client
        .umnt(dirpath(Opaque::borrowed(b"/")))
        .await
        .unwrap();
    c.mount_client.umntall().await.unwrap();
    assert_eq!(c.mount_client.dump().await.unwrap().0.len(), 0);
}

#[tokio::test]
async fn write_read_commit_round_trip() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let fh = create(&mut c, &root, "data.bin").await;
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let w = write(&mut c, &fh, 0, &payload, stable_how::UNSTABLE).await;
    assert_eq!(w.count as usize, payload.len());
    assert_eq!(w.committed, stable_how::UNSTABLE);
    let w2 = write(
        &mut c,
        &fh,
        payload.len() as u64,
        b"tail",
        stable_how::FILE_SYNC,
    )
    .await;
    assert_eq!(w2.committed, stable_how::FILE_SYNC);
    assert_eq!(w.verf, w2.verf);
    let commit = c
        .commit(&COMMIT3args {
            file: fh.clone(),
            offset: 0,
            count: 0,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(commit.verf, w.verf, "WRITE and COMMIT share one verifier");

    let (data, eof) = read(&mut c, &fh, 0, 1 << 20).await;
    assert!(eof);
    assert_eq!(data.len(), payload.len() + 4);
    assert!(data[..payload.len()] == payload[..] && &data[payload.len()..] == b"tail");
    let (part, eof) = read(&mut c, &fh, 10, 100).await;
    assert!(!eof);
    assert_eq!(part, payload[10..110]);
    let (past, eof) = read(&mut c, &fh, 10_000_000, 100).await;
    assert!(past.is_empty() && eof);
    assert_eq!(
        std::fs::read(server.path("data.bin")).unwrap().len(),
        payload.len() + 4
    );
}

#[tokio::test]
async fn a_write_past_the_end_leaves_a_hole_that_reads_as_zeros() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let fh = create(&mut c, &root, "sparse").await;
    write(&mut c, &fh, 1 << 20, b"end", stable_how::UNSTABLE).await;
    write(&mut c, &fh, 0, b"start", stable_how::UNSTABLE).await;
    let attr = getattr(&mut c, &fh).await.unwrap();
    assert_eq!(attr.size, (1 << 20) + 3);
    let (mid, _) = read(&mut c, &fh, 100, 1000).await;
    assert!(mid.iter().all(|&b| b == 0));
}

#[tokio::test]
async fn create_modes_and_exclusive_verifiers() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let guarded = |n: &str| CREATE3args {
        where_: dirop(&root, n),
        how: createhow3::GUARDED(sattr3::default()),
    };
    assert_eq!(
        status_of(&c.create(&guarded("g")).await.unwrap()),
        nfsstat3::NFS3_OK
    );
    assert_eq!(
        status_of(&c.create(&guarded("g")).await.unwrap()),
        nfsstat3::NFS3ERR_EXIST
    );

    let excl = |v: u8| CREATE3args {
        where_: dirop(&root, "x"),
        how: createhow3::EXCLUSIVE(createverf3([v; 8])),
    };
    let first = c.create(&excl(1)).await.unwrap().unwrap();
    let again = c.create(&excl(1)).await.unwrap().unwrap();
    assert_eq!(
        first.obj.unwrap(),
        again.obj.unwrap(),
        "a retransmitted exclusive create succeeds"
    );
    assert_eq!(
        status_of(&c.create(&excl(2)).await.unwrap()),
        nfsstat3::NFS3ERR_EXIST
    );

    // UNCHECKED over an existing file with size 0 truncates it.
    let fh = create(&mut c, &root, "u").await;
    write(&mut c, &fh, 0, b"hello", stable_how::FILE_SYNC).await;
    let truncate = sattr3 {
        size: Nfs3Option::Some(0),
        ..Default::default()
    };
    c.create(&CREATE3args {
        where_: dirop(&root, "u"),
        how: createhow3::UNCHECKED(truncate),
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(getattr(&mut c, &fh).await.unwrap().size, 0);

    // Mode bits from the client are honoured.
    let mode = sattr3 {
        mode: Nfs3Option::Some(0o600),
        ..Default::default()
    };
    let made = c
        .create(&CREATE3args {
            where_: dirop(&root, "m"),
            how: createhow3::GUARDED(mode),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(made.obj_attributes.unwrap().mode, 0o600);
    assert_eq!(
        std::fs::metadata(server.path("m")).unwrap().mode() & 0o7777,
        0o600
    );
}

#[tokio::test]
async fn mkdir_symlink_readlink_mknod_link() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let sub = mkdir(&mut c, &root, "sub").await.unwrap();
    assert_eq!(
        mkdir(&mut c, &root, "sub").await,
        Err(nfsstat3::NFS3ERR_EXIST)
    );
    assert_eq!(getattr(&mut c, &sub).await.unwrap().type_, ftype3::NF3DIR);

    let link = c
        .symlink(&SYMLINK3args {
            where_: dirop(&root, "ln"),
            symlink: symlinkdata3 {
                symlink_attributes: sattr3::default(),
                symlink_data: nfspath3(Opaque::borrowed(b"../outside/target")),
            },
        })
        .await
        .unwrap()
        .unwrap()
        .obj
        .unwrap();
    let target = c
        .readlink(&READLINK3args {
            symlink: link.clone(),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(target.data.as_ref(), b"../outside/target");
    assert_eq!(getattr(&mut c, &link).await.unwrap().type_, ftype3::NF3LNK);

    for (name, what, kind) in [
        (
            "fifo",
            mknoddata3::NF3FIFO(sattr3::default()),
            ftype3::NF3FIFO,
        ),
        (
            "sock",
            mknoddata3::NF3SOCK(sattr3::default()),
            ftype3::NF3SOCK,
        ),
    ] {
        let made = c
            .mknod(&MKNOD3args {
                where_: dirop(&root, name),
                what,
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(made.obj_attributes.unwrap().type_, kind, "{name}");
    }

    let file = create(&mut c, &root, "f").await;
    let linked = c
        .link(&LINK3args {
            file: file.clone(),
            link: dirop(&sub, "f2"),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(linked.file_attributes.unwrap().nlink, 2);
    let (fh2, _) = lookup(&mut c, &sub, "f2").await.unwrap();
    assert_eq!(fh2, file, "both names are one file with one handle");
    let dir_link = c
        .link(&LINK3args {
            file: sub.clone(),
            link: dirop(&root, "dirlink"),
        })
        .await
        .unwrap();
    assert_ne!(
        status_of(&dir_link),
        nfsstat3::NFS3_OK,
        "directories cannot be hard linked"
    );
}

#[tokio::test]
async fn remove_rmdir_rename() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let a = mkdir(&mut c, &root, "a").await.unwrap();
    create(&mut c, &a, "inner").await;
    let rmdir = |n: &str| RMDIR3args {
        object: dirop(&root, n),
    };
    assert_eq!(
        status_of(&c.rmdir(&rmdir("a")).await.unwrap()),
        nfsstat3::NFS3ERR_NOTEMPTY
    );
    let remove_dir = c
        .remove(&REMOVE3args {
            object: dirop(&root, "a"),
        })
        .await
        .unwrap();
    assert_ne!(status_of(&remove_dir), nfsstat3::NFS3_OK);

    // Rename a file over another: the target's handle goes stale.
    let x = create(&mut c, &root, "x").await;
    let y = create(&mut c, &root, "y").await;
    write(&mut c, &x, 0, b"x data", stable_how::FILE_SYNC).await;
    let renamed = c
        .rename(&RENAME3args {
            from: dirop(&root, "x"),
            to: dirop(&root, "y"),
        })
        .await
        .unwrap()
        .unwrap();
    assert!(renamed.fromdir_wcc.before.is_some() && renamed.todir_wcc.after.is_some());
    assert_eq!(
        lookup(&mut c, &root, "x").await.unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );
    let (now_y, _) = lookup(&mut c, &root, "y").await.unwrap();
    assert_eq!(now_y, x, "the moved file keeps its handle");
    assert_eq!(
        getattr(&mut c, &y).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );

    // Rename a directory; its contents follow it.
    c.rename(&RENAME3args {
        from: dirop(&root, "a"),
        to: dirop(&root, "b"),
    })
    .await
    .unwrap()
    .unwrap();
    let (b, _) = lookup(&mut c, &root, "b").await.unwrap();
    assert_eq!(b, a);
    lookup(&mut c, &b, "inner").await.unwrap();
    // Into itself is refused.
    let into_self = c
        .rename(&RENAME3args {
            from: dirop(&root, "b"),
            to: dirop(&b, "loop"),
        })
        .await
        .unwrap();
    assert_eq!(status_of(&into_self), nfsstat3::NFS3ERR_INVAL);

    let removed = c
        .remove(&REMOVE3args {
            object: dirop(&b, "inner"),
        })
        .await
        .unwrap()
        .unwrap();
    assert!(removed.dir_wcc.before.is_some() && removed.dir_wcc.after.is_some());
    c.rmdir(&rmdir("b")).await.unwrap().unwrap();
    assert!(!server.path("b").exists());
    assert_eq!(
        status_of(
            &c.remove(&REMOVE3args {
                object: dirop(&root, "b")
            })
            .await
            .unwrap()
        ),
        nfsstat3::NFS3ERR_NOENT
    );
}

#[tokio::test]
async fn setattr_mode_size_times_and_guard() {
    let server = TestServer::start();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let fh = create(&mut c, &root, "f").await;
    write(&mut c, &fh, 0, &[7; 1000], stable_how::FILE_SYNC).await;
    let set = sattr3 {
        mode: Nfs3Option::Some(0o640),
        size: Nfs3Option::Some(10),
        mtime: set_mtime::SET_TO_CLIENT_TIME(nfstime3 {
            seconds: 1_000_000_000,
            nseconds: 5,
        }),
        ..Default::default()
    };
    let ok = c
        .setattr(&SETATTR3args {
            object: fh.clone(),
            new_attributes: set,
            guard: Nfs3Option::None,
        })
        .await
        .unwrap()
        .unwrap();
    let before = ok.obj_wcc.before.unwrap();
    let after = ok.obj_wcc.after.unwrap();
    assert_eq!((before.size, after.size, after.mode), (1000, 10, 0o640));
    assert_eq!(
        after.mtime,
        nfstime3 {
            seconds: 1_000_000_000,
            nseconds: 5
        }
    );
    let meta = std::fs::metadata(server.path("f")).unwrap();
    assert_eq!(
        (meta.len(), meta.mode() & 0o777, meta.mtime()),
        (10, 0o640, 1_000_000_000)
    );

    let stale_guard = Nfs3Option::Some(nfstime3 {
        seconds: 1,
        nseconds: 0,
    });
    let guarded = SETATTR3args {
        object: fh.clone(),
        new_attributes: sattr3 {
            mode: Nfs3Option::Some(0o600),
            ..Default::default()
        },
        guard: stale_guard,
    };
    assert_eq!(
        status_of(&c.setattr(&guarded).await.unwrap()),
        nfsstat3::NFS3ERR_NOT_SYNC
    );
    let right_guard = Nfs3Option::Some(after.ctime);
    let guarded = SETATTR3args {
        object: fh,
        new_attributes: sattr3 {
            mode: Nfs3Option::Some(0o600),
            ..Default::default()
        },
        guard: right_guard,
    };
    c.setattr(&guarded).await.unwrap().unwrap();
}

#[tokio::test]
async fn readdir_pages_list_every_entry_once() {
    let server = TestServer::start();
    for i in 0..300 {
        std::fs::write(
            server.path(&format!("file-with-a-longish-name-{i:04}")),
            b"",
        )
        .unwrap();
    }
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let mut want: Vec<String> = (0..300)
        .map(|i| format!("file-with-a-longish-name-{i:04}"))
        .collect();
    want.extend([".".to_string(), "..".to_string()]);
    want.sort();
    for count in [1024, 4096, 65536] {
        let mut names = list_names(&mut c, &root, count).await;
        names.sort();
        assert_eq!(names, want, "pages of {count} bytes");
    }
    // READDIRPLUS: attributes and handles for each entry, within maxcount.
    let mut seen = Vec::new();
    let mut cookie = 0;
    let mut verf = cookieverf3::default();
    loop {
        let args = READDIRPLUS3args {
            dir: root.clone(),
            cookie,
            cookieverf: verf,
            dircount: 4096,
            maxcount: 8192,
        };
        let ok = c.readdirplus(&args).await.unwrap().unwrap();
        verf = ok.cookieverf;
        for e in &ok.reply.entries.0 {
            let attr = e.name_attributes.clone().unwrap();
            assert_eq!(attr.fileid, e.fileid);
            if e.name.as_ref() != b".." {
                let fh = e.name_handle.clone().unwrap();
                assert_eq!(getattr(&mut c, &fh).await.unwrap().fileid, e.fileid);
            }
            seen.push(String::from_utf8(e.name.as_ref().to_vec()).unwrap());
            cookie = e.cookie;
        }
        if ok.reply.eof {
            break;
        }
    }
    seen.sort();
    assert_eq!(seen, want);
}

#[tokio::test]
async fn a_listing_resumed_while_entries_change_neither_repeats_nor_skips() {
    let server = TestServer::start();
    for i in 0..100 {
        std::fs::write(server.path(&format!("f{i:03}")), b"").unwrap();
    }
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let first = c
        .readdir(&READDIR3args {
            dir: root.clone(),
            cookie: 0,
            cookieverf: cookieverf3::default(),
            count: 1024,
        })
        .await
        .unwrap()
        .unwrap();
    let seen_first: Vec<Vec<u8>> = first
        .reply
        .entries
        .0
        .iter()
        .map(|e| e.name.as_ref().to_vec())
        .collect();
    let cookie = first.reply.entries.0.last().unwrap().cookie;
    // Change the directory between pages: remove one already listed, add some.
    let listed = String::from_utf8(
        seen_first
            .iter()
            .find(|n| n.starts_with(b"f"))
            .unwrap()
            .clone(),
    )
    .unwrap();
    std::fs::remove_file(server.path(&listed)).unwrap();
    for i in 0..20 {
        std::fs::write(server.path(&format!("new{i:02}")), b"").unwrap();
    }
    let mut rest = Vec::new();
    let mut cookie = cookie;
    loop {
        let ok = c
            .readdir(&READDIR3args {
                dir: root.clone(),
                cookie,
                cookieverf: first.cookieverf,
                count: 1024,
            })
            .await
            .unwrap()
            .unwrap();
        for e in &ok.reply.entries.0 {
            rest.push(e.name.as_ref().to_vec());
            cookie = e.cookie;
        }
        if ok.reply.eof {
            break;
        }
    }
    for name in &rest {
        assert!(
            !seen_first.contains(name),
            "{} listed twice",
            String::from_utf8_lossy(name)
        );
    }
    for i in 0..100 {
        let n = format!("f{i:03}").into_bytes();
        if n != listed.as_bytes() {
            assert!(
                seen_first.contains(&n) || rest.contains(&n),
                "f{i:03} skipped"
            );
        }
    }
}

#[tokio::test]
async fn a_cookie_with_a_foreign_verifier_is_bad() {
    let server = TestServer::start();
    std::fs::write(server.path("a"), b"").unwrap();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let res = c
        .readdir(&READDIR3args {
            dir: root,
            cookie: 5,
            cookieverf: cookieverf3([9; 8]),
            count: 4096,
        })
        .await
        .unwrap();
    assert_eq!(status_of(&res), nfsstat3::NFS3ERR_BAD_COOKIE);
}

#[tokio::test]
async fn access_follows_mode_bits_and_the_callers_ids() {
    if !rustix::process::geteuid().is_root() {
        layerfs_testkit::skip_or_fail(
            "access by mode bits",
            "giving a file to another user needs root",
        );
        return;
    }
    let server = TestServer::start();
    let mut root_conn = mount(server.port()).await;
    let root = root_conn.root_nfs_fh3();
    let fh = create(&mut root_conn, &root, "private").await;
    let set = sattr3 {
        mode: Nfs3Option::Some(0o640),
        uid: Nfs3Option::Some(1000),
        gid: Nfs3Option::Some(1000),
        ..Default::default()
    };
    root_conn
        .setattr(&SETATTR3args {
            object: fh.clone(),
            new_attributes: set,
            guard: Nfs3Option::None,
        })
        .await
        .unwrap()
        .unwrap();
    let all = 0x3f;
    let ask = |fh: &nfs_fh3| ACCESS3args {
        object: fh.clone(),
        access: all,
    };
    let mut owner = mount_as(server.port(), 1000, 1000).await;
    assert_eq!(
        owner.access(&ask(&fh)).await.unwrap().unwrap().access,
        0x01 | 0x04 | 0x08
    );
    let mut group = mount_as(server.port(), 2000, 1000).await;
    assert_eq!(group.access(&ask(&fh)).await.unwrap().unwrap().access, 0x01);
    let mut other = mount_as(server.port(), 3000, 3000).await;
    assert_eq!(other.access(&ask(&fh)).await.unwrap().unwrap().access, 0);
    // And the server enforces it: another user can neither read nor write.
    let denied = other
        .read(&READ3args {
            file: fh.clone(),
            offset: 0,
            count: 10,
        })
        .await
        .unwrap();
    assert_eq!(status_of(&denied), nfsstat3::NFS3ERR_ACCES);
    let denied = other
        .write(&WRITE3args {
            file: fh.clone(),
            offset: 0,
            count: 1,
            stable: stable_how::FILE_SYNC,
            data: Opaque::borrowed(b"x"),
        })
        .await
        .unwrap();
    assert_eq!(status_of(&denied), nfsstat3::NFS3ERR_ACCES);
    // Nor create in a directory it may not write.
    let denied = other
        .create(&CREATE3args {
            where_: dirop(&root, "nope"),
            how: createhow3::UNCHECKED(sattr3::default()),
        })
        .await
        .unwrap();
    assert_eq!(status_of(&denied), nfsstat3::NFS3ERR_ACCES);
    // A file made by a user belongs to it.
    let set = sattr3 {
        mode: Nfs3Option::Some(0o777),
        ..Default::default()
    };
    root_conn
        .setattr(&SETATTR3args {
            object: root.clone(),
            new_attributes: set,
            guard: Nfs3Option::None,
        })
        .await
        .unwrap()
        .unwrap();
    let made = other
        .create(&CREATE3args {
            where_: dirop(&root, "mine"),
            how: createhow3::UNCHECKED(sattr3::default()),
        })
        .await
        .unwrap()
        .unwrap();
    let attr = made.obj_attributes.unwrap();
    assert_eq!((attr.uid, attr.gid), (3000, 3000));
}
