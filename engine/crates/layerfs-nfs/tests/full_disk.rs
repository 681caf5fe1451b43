//! A full disk is NOSPC to the client, and the server keeps serving. Needs
//! root to mount a small tmpfs; without it the test says SKIPPED (or fails
//! where LAYERFS_REQUIRE_MOUNTS=1).

mod support;

use layerfs_testkit::{or_skip, Mounted};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use support::*;

#[tokio::test]
async fn a_full_disk_is_nospc_and_the_server_goes_on() {
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
