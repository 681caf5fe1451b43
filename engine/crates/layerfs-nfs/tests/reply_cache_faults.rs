//! The reply cache when the connection is cut: a client whose connection
//! broke after it sent a call that changes something, before it read the
//! reply, reconnects from a new port and retransmits. It gets the original
//! reply, and the change happened once.

mod support;

use std::time::Duration;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Pack};
use support::*;

/// Sends the call, cuts the connection before reading the reply, waits
/// until `happened` sees its change on disk (a server that dropped a call
/// whose connection closed would pass the rest: the retransmission alone
/// would make the change), then retransmits the same call from a new
/// connection; the reply it gets.
fn retransmitted(
    port: u16,
    xid: u32,
    proc: u32,
    args: &impl Pack,
    happened: impl Fn() -> bool,
) -> Vec<u8> {
    let mut first = RawClient::connect(port);
    first.send(xid, proc, args);
    drop(first); // gone before the reply could be read
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !happened() {
        assert!(
            std::time::Instant::now() < deadline,
            "call {xid}: its change never happened after its connection closed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Long enough for the first to have sent its reply into the cache: a
    // retransmission of a call still running is dropped, and this client
    // would wait on it.
    std::thread::sleep(Duration::from_millis(200));
    let mut again = RawClient::connect(port);
    again.send(xid, proc, args);
    let (got, results) = again.recv();
    assert_eq!(got, xid);
    results
}

#[tokio::test]
async fn each_change_cut_off_before_its_reply_happens_once_and_replays() {
    let server = TestServer::start();
    let port = server.port();
    std::fs::write(server.path("victim"), b"x").unwrap();
    std::fs::write(server.path("moving"), b"x").unwrap();
    std::fs::write(server.path("linked"), b"x").unwrap();
    std::fs::write(server.path("written"), b"").unwrap();
    let mut c = mount(port).await;
    let root = c.root_nfs_fh3();
    let (linked, _) = lookup(&mut c, &root, "linked").await.unwrap();
    let (written, _) = lookup(&mut c, &root, "written").await.unwrap();

    let create = CREATE3args {
        where_: dirop(&root, "created"),
        how: createhow3::GUARDED(sattr3::default()),
    };
    let r = retransmitted(port, 101, 8, &create, || server.path("created").is_file());
    assert_eq!(
        status_of(&decode::<CREATE3res>(&r)),
        nfsstat3::NFS3_OK,
        "not EXIST"
    );
    assert!(server.path("created").is_file());

    let r = retransmitted(
        port,
        102,
        12,
        &REMOVE3args {
            object: dirop(&root, "victim"),
        },
        || !server.path("victim").exists(),
    );
    assert_eq!(
        status_of(&decode::<REMOVE3res>(&r)),
        nfsstat3::NFS3_OK,
        "not NOENT"
    );
    assert!(!server.path("victim").exists());

    let rename = RENAME3args {
        from: dirop(&root, "moving"),
        to: dirop(&root, "moved"),
    };
    let r = retransmitted(port, 103, 14, &rename, || server.path("moved").is_file());
    assert_eq!(
        status_of(&decode::<RENAME3res>(&r)),
        nfsstat3::NFS3_OK,
        "not NOENT"
    );
    assert!(server.path("moved").is_file() && !server.path("moving").exists());

    let link = LINK3args {
        file: linked,
        link: dirop(&root, "second-name"),
    };
    let r = retransmitted(port, 104, 15, &link, || server.path("second-name").exists());
    assert_eq!(
        status_of(&decode::<LINK3res>(&r)),
        nfsstat3::NFS3_OK,
        "not EXIST"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(server.path("linked")).unwrap().nlink(), 2);

    let mkdir = MKDIR3args {
        where_: dirop(&root, "dir"),
        attributes: sattr3::default(),
    };
    let r = retransmitted(port, 105, 9, &mkdir, || server.path("dir").is_dir());
    assert_eq!(
        status_of(&decode::<MKDIR3res>(&r)),
        nfsstat3::NFS3_OK,
        "not EXIST"
    );
    assert!(server.path("dir").is_dir());

    let write = WRITE3args {
        file: written,
        offset: 0,
        count: 5,
        stable: stable_how::FILE_SYNC,
        data: Opaque::borrowed(b"hello"),
    };
    let r = retransmitted(port, 106, 7, &write, || {
        std::fs::read(server.path("written")).is_ok_and(|d| d == b"hello")
    });
    assert_eq!(status_of(&decode::<WRITE3res>(&r)), nfsstat3::NFS3_OK);
    assert_eq!(std::fs::read(server.path("written")).unwrap(), b"hello");
}

#[tokio::test]
async fn a_large_write_cut_off_before_its_reply_replays_and_one_of_other_bytes_runs() {
    let server = TestServer::start();
    let port = server.port();
    std::fs::write(server.path("large"), b"").unwrap();
    let mut c = mount(port).await;
    let root = c.root_nfs_fh3();
    let (large, _) = lookup(&mut c, &root, "large").await.unwrap();
    let write = |data: &'static [u8]| WRITE3args {
        file: large.clone(),
        offset: 0,
        count: data.len() as u32,
        stable: stable_how::UNSTABLE,
        data: Opaque::borrowed(data),
    };
    // A megabyte: its arguments are hashed for the reply cache only after
    // its reply has left.
    static FIRST: [u8; 1 << 20] = [b'a'; 1 << 20];
    let mut first = RawClient::connect(port);
    first.send(201, 7, &write(&FIRST));
    drop(first);
    std::thread::sleep(Duration::from_millis(300));
    // Changed behind the server's back: a run of the retransmission would
    // write the a's again, a replay leaves this.
    std::fs::write(server.path("large"), b"changed").unwrap();
    let mut again = RawClient::connect(port);
    again.send(201, 7, &write(&FIRST));
    let (xid, results) = again.recv();
    assert_eq!(xid, 201);
    assert_eq!(status_of(&decode::<WRITE3res>(&results)), nfsstat3::NFS3_OK);
    assert_eq!(std::fs::read(server.path("large")).unwrap(), b"changed");

    // The same xid, length and caller with other bytes is another call.
    static OTHER: [u8; 1 << 20] = [b'b'; 1 << 20];
    again.send(201, 7, &write(&OTHER));
    let (_, results) = again.recv();
    assert_eq!(status_of(&decode::<WRITE3res>(&results)), nfsstat3::NFS3_OK);
    assert_eq!(std::fs::read(server.path("large")).unwrap(), &OTHER[..]);
}
