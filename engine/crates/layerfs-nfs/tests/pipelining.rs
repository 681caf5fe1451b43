//! Calls pipelined on one connection as real clients send them, and
//! retransmissions answered from the duplicate request cache.

mod support;

use std::collections::HashMap;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use support::*;

const GETATTR: u32 = 1;
const READ: u32 = 6;
const WRITE: u32 = 7;
const CREATE: u32 = 8;
const REMOVE: u32 = 12;
const READDIR: u32 = 16;
const COMMIT: u32 = 21;

async fn root_handle(port: u16) -> nfs_fh3 {
    mount(port).await.root_nfs_fh3()
}

#[tokio::test]
async fn a_retransmitted_remove_gets_the_original_reply() {
    let server = TestServer::start();
    std::fs::write(server.path("victim"), b"x").unwrap();
    let root = root_handle(server.port()).await;
    let remove = REMOVE3args {
        object: dirop(&root, "victim"),
    };
    let mut first = RawClient::connect(server.port());
    first.send(0x77, REMOVE, &remove);
    let (xid, original) = first.recv();
    assert_eq!(xid, 0x77);
    assert_eq!(
        status_of(&decode::<REMOVE3res>(&original)),
        nfsstat3::NFS3_OK
    );
    // The client reconnects from a new port and sends the same call again.
    drop(first);
    let mut again = RawClient::connect(server.port());
    again.send(0x77, REMOVE, &remove);
    let (_, replayed) = again.recv();
    assert_eq!(replayed, original, "the original reply, not NOENT");
    // A new call (new xid) really runs.
    again.send(0x78, REMOVE, &remove);
    let (_, fresh) = again.recv();
    assert_eq!(
        status_of(&decode::<REMOVE3res>(&fresh)),
        nfsstat3::NFS3ERR_NOENT
    );
}

#[tokio::test]
async fn two_clients_whose_xids_and_first_bytes_coincide_both_run() {
    let server = TestServer::start();
    std::fs::write(server.path("shared"), b"").unwrap();
    let mut c = mount(server.port()).await;
    let root = c.root_nfs_fh3();
    let (file, _) = lookup(&mut c, &root, "shared").await.unwrap();
    // Two processes on 127.0.0.1, each starting its xids at 1, write
    // different data at the same offset: alike in their first 300 bytes.
    let mut data = [vec![b'a'; 4096], vec![b'a'; 4096]];
    data[1][300..].fill(b'b');
    for (i, bytes) in data.iter().enumerate() {
        let write = WRITE3args {
            file: file.clone(),
            offset: 0,
            count: bytes.len() as u32,
            stable: stable_how::FILE_SYNC,
            data: Opaque::borrowed(bytes),
        };
        let mut client = RawClient::connect(server.port());
        client.send(1, WRITE, &write);
        let (_, reply) = client.recv();
        assert_eq!(status_of(&decode::<WRITE3res>(&reply)), nfsstat3::NFS3_OK);
        assert!(
            std::fs::read(server.path("shared")).unwrap() == *bytes,
            "the file does not hold client {i}'s data: its WRITE did not run"
        );
    }
}

#[tokio::test]
async fn a_retransmitted_exclusive_create_after_a_reconnect_succeeds() {
    let server = TestServer::start();
    let root = root_handle(server.port()).await;
    let args = CREATE3args {
        where_: dirop(&root, "once"),
        how: createhow3::GUARDED(sattr3::default()),
    };
    let mut c = RawClient::connect(server.port());
    c.send(9, CREATE, &args);
    let (_, first) = c.recv();
    drop(c);
    let mut c = RawClient::connect(server.port());
    c.send(9, CREATE, &args);
    let (_, second) = c.recv();
    assert_eq!(first, second);
    assert_eq!(status_of(&decode::<CREATE3res>(&second)), nfsstat3::NFS3_OK);
}

/// What the macOS client does (it cannot run here): 32 KiB READ and WRITE,
/// plain READDIR, up to 16 calls in flight on one connection.
#[tokio::test]
async fn a_macos_like_client_with_16_calls_in_flight() {
    let server = TestServer::start();
    let mut conn = mount(server.port()).await;
    let root = conn.root_nfs_fh3();
    let fh = create(&mut conn, &root, "mac.bin").await;
    let chunk = 32 * 1024;
    let data: Vec<u8> = (0..chunk * 64).map(|i| (i % 253) as u8).collect();
    let mut c = RawClient::connect(server.port());
    let mut verfs = Vec::new();
    for window in data.chunks(chunk * 16).enumerate() {
        let (w, block) = window;
        // 16 WRITEs sent back to back, in reverse order: out-of-order arrival.
        for (i, piece) in block.chunks(chunk).enumerate().rev() {
            let offset = (w * 16 + i) * chunk;
            let args = WRITE3args {
                file: fh.clone(),
                offset: offset as u64,
                count: piece.len() as u32,
                stable: stable_how::UNSTABLE,
                data: Opaque::borrowed(piece),
            };
            c.send((w * 16 + i) as u32, WRITE, &args);
        }
        for _ in 0..16 {
            let (_, res) = c.recv();
            let ok = decode::<WRITE3res>(&res).unwrap();
            assert_eq!(ok.count as usize, chunk);
            verfs.push(ok.verf);
        }
    }
    c.send(
        1000,
        COMMIT,
        &COMMIT3args {
            file: fh.clone(),
            offset: 0,
            count: 0,
        },
    );
    let (_, res) = c.recv();
    let commit = decode::<COMMIT3res>(&res).unwrap();
    assert!(verfs.iter().all(|v| *v == commit.verf));

    for i in 0..64u32 {
        c.send(
            2000 + i,
            READ,
            &READ3args {
                file: fh.clone(),
                offset: u64::from(i) * chunk as u64,
                count: chunk as u32,
            },
        );
        if i % 16 == 15 {
            // keep at most 16 in flight
            let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
            for _ in 0..16 {
                let (xid, res) = c.recv();
                let ok = decode::<READ3res>(&res).unwrap();
                got.insert(xid, ok.data.to_vec());
            }
            for (xid, bytes) in got {
                let at = (xid - 2000) as usize * chunk;
                assert!(
                    bytes == data[at..at + chunk],
                    "READ {xid} returned the bytes written"
                );
            }
        }
    }
    // Plain READDIR in 32 KiB.
    c.send(
        3000,
        READDIR,
        &READDIR3args {
            dir: root.clone(),
            cookie: 0,
            cookieverf: cookieverf3::default(),
            count: 32 * 1024,
        },
    );
    let (_, res) = c.recv();
    let listing = decode::<READDIR3res>(&res).unwrap();
    let names: Vec<&[u8]> = listing
        .reply
        .entries
        .0
        .iter()
        .map(|e| e.name.as_ref())
        .collect();
    assert!(
        names.contains(&&b"mac.bin"[..])
            && names.contains(&&b"."[..])
            && names.contains(&&b".."[..])
    );
    assert!(listing.reply.eof);
}

/// The Linux client's 1 MiB WRITEs: records larger than the read-ahead,
/// several in flight, with small calls between them.
#[tokio::test]
async fn one_mib_writes_pipelined_with_small_calls() {
    let server = TestServer::start();
    let mut conn = mount(server.port()).await;
    let root = conn.root_nfs_fh3();
    let fh = create(&mut conn, &root, "big.bin").await;
    let mib = 1 << 20;
    let data: Vec<u8> = (0..mib * 4).map(|i| (i * 13 % 255) as u8).collect();
    let mut c = RawClient::connect(server.port());
    let mut burst = Vec::new();
    for i in 0..4 {
        let args = WRITE3args {
            file: fh.clone(),
            offset: (i * mib) as u64,
            count: mib as u32,
            stable: stable_how::UNSTABLE,
            data: Opaque::borrowed(&data[i * mib..(i + 1) * mib]),
        };
        burst.extend(RawClient::frame(i as u32, 100_003, WRITE, &args));
        burst.extend(RawClient::frame(
            100 + i as u32,
            100_003,
            GETATTR,
            &GETATTR3args { object: fh.clone() },
        ));
    }
    c.send_raw(&burst);
    for _ in 0..8 {
        let (xid, res) = c.recv();
        if xid < 100 {
            assert_eq!(decode::<WRITE3res>(&res).unwrap().count as usize, mib);
        } else {
            assert_eq!(status_of(&decode::<GETATTR3res>(&res)), nfsstat3::NFS3_OK);
        }
    }
    assert!(std::fs::read(server.path("big.bin")).unwrap() == data);
}
