//! A full disk is NOSPC to the client, and the server keeps serving. Needs
//! root to mount a small tmpfs; without it the test says SKIPPED (or fails
//! where LAYERFS_REQUIRE_MOUNTS=1).

mod support;

use std::io::Write;
use std::sync::Arc;

use layerfs_layers::StackFs;
use layerfs_testkit::{or_skip, Mounted};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use support::*;

/// Held by each test for its whole run. A test forks `mount` and `umount`,
/// and until the child's exec closes them it holds a copy of every
/// descriptor the process has open, among them the other test's server's
/// descriptor of a removed file: the removed file's blocks are freed only
/// then, and the other test's write that needs them meets NOSPC: 6 runs in
/// 100 on a busy machine, none in 100 with the tests one after the other,
/// and 14 in 50 of the first test alone beside a thread forking `true`.
/// (Each test runs on a runtime of its own, on its own thread: holding the
/// guard across its awaits blocks no other task.)
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[tokio::test]
#[allow(clippy::await_holding_lock)]
async fn a_full_disk_is_nospc_and_the_server_goes_on() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let Some(_fs) = or_skip(Mounted::tmpfs(dir.path(), "256k"), "a full disk") else {
        return;
    };
    let handle = serve(dir.path());
    let mut c = mount(handle.local_addr().port()).await;
    let root = c.root_nfs_fh3();
    let fh = create(&mut c, &root, "big").await;
    let chunk = vec![7u8; 64 * 1024];
    let mut status = nfsstat3::NFS3_OK;
    for i in 0..8u64 {
        let args = WRITE3args {
            file: fh.clone(),
            offset: i * chunk.len() as u64,
            count: chunk.len() as u32,
            stable: stable_how::FILE_SYNC,
            data: Opaque::borrowed(&chunk),
        };
        status = status_of(&c.write(&args).await.unwrap());
        if status != nfsstat3::NFS3_OK {
            break;
        }
    }
    assert_eq!(status, nfsstat3::NFS3ERR_NOSPC);
    // Room again after a remove, and the same connection carries on.
    c.remove(&REMOVE3args {
        object: dirop(&root, "big"),
    })
    .await
    .unwrap()
    .unwrap();
    let small = create(&mut c, &root, "small").await;
    write(&mut c, &small, 0, b"fits", stable_how::FILE_SYNC).await;
    assert_eq!(read(&mut c, &small, 0, 10).await.0, b"fits");
}

/// A workspace whose upper fills while clients copy lower files up: each
/// gets NOSPC and sees the lower file whole; once there is room, the same
/// handles change the files.
#[tokio::test]
#[allow(clippy::await_holding_lock)]
async fn a_full_upper_is_nospc_to_every_copy_up_until_there_is_room() {
    let _alone = alone();
    const FILES: usize = 40;
    let t = tempfile::tempdir().unwrap();
    let lower = t.path().join("lower");
    let upper = t.path().join("upper");
    std::fs::create_dir_all(&lower).unwrap();
    std::fs::create_dir_all(&upper).unwrap();
    for i in 0..FILES {
        std::fs::write(lower.join(format!("f{i}")), b"lower").unwrap();
    }
    let Some(_fs) = or_skip(Mounted::tmpfs(&upper, "1m"), "a full upper") else {
        return;
    };
    let stack = StackFs::open_in_upper(std::slice::from_ref(&lower), &upper).unwrap();
    let handle = serve_fs(Arc::new(stack), &upper);
    let mut c = mount(handle.local_addr().port()).await;
    let root = c.root_nfs_fh3();
    let mut files = Vec::new();
    for i in 0..FILES {
        files.push(lookup(&mut c, &root, &format!("f{i}")).await.unwrap().0);
    }
    let filler = std::fs::File::create(upper.join("filler")).unwrap();
    let mut full = 0;
    while (&filler).write_all(&[0u8; 4096]).is_ok() {
        full += 4096;
    }
    let mut refused = 0;
    for (i, fh) in files.iter().enumerate() {
        // A page more room every third file: the copy's data, then the
        // inode map's commit, meet the full disk in turn.
        filler.set_len(full - (i as u64 / 3) * 4096).unwrap();
        let args = WRITE3args {
            file: fh.clone(),
            offset: 0,
            count: 5,
            stable: stable_how::FILE_SYNC,
            data: Opaque::borrowed(b"UPPER"),
        };
        match status_of(&c.write(&args).await.unwrap()) {
            nfsstat3::NFS3_OK => assert_eq!(read(&mut c, fh, 0, 10).await.0, b"UPPER"),
            nfsstat3::NFS3ERR_NOSPC => {
                refused += 1;
                assert_eq!(read(&mut c, fh, 0, 10).await.0, b"lower", "f{i}");
            }
            other => panic!("f{i} on a full upper: {other:?}"),
        }
    }
    assert!(refused > 0, "the upper never filled");
    drop(filler);
    std::fs::remove_file(upper.join("filler")).unwrap();
    for fh in &files {
        write(&mut c, fh, 0, b"AGAIN", stable_how::FILE_SYNC).await;
        assert_eq!(read(&mut c, fh, 0, 10).await.0, b"AGAIN");
    }
}
