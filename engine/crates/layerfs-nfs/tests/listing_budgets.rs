//! READDIR and READDIRPLUS replies within the client's byte budgets: each
//! page's results no larger than `count` (`maxcount`), its entries' directory
//! information within `dircount`, pages as full as the budget allows, every
//! entry listed once, and TOOSMALL when not even one entry fits.

use std::net::IpAddr;
use std::sync::Arc;

mod support;

use layerfs_rpc::{Dispatcher, Outcome};
use layerfs_vfs::LocalFs;
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Pack, Unpack};
use support::{call_record, xdr_opaque};

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;

/// The results of one call: the reply after its 24-byte accepted header.
fn results(d: &Dispatcher, record: &[u8]) -> Vec<u8> {
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let Outcome::Reply(reply) = d.handle(record, peer) else {
        panic!("dropped")
    };
    let body = &reply.bytes()[4..];
    assert_eq!(body[20..24], [0; 4], "an accepted, successful call");
    body[24..].to_vec()
}

fn decode<T: Unpack>(bytes: &[u8]) -> T {
    let mut at = bytes;
    let (value, len) = T::unpack(&mut at).expect("a well-formed reply");
    assert_eq!(len, bytes.len(), "nothing after the results");
    value
}

fn args(value: &impl Pack) -> Vec<u8> {
    let mut out = Vec::new();
    value.pack(&mut out).unwrap();
    out
}

/// A directory of entries whose names run from 1 to 255 bytes, served.
fn served() -> (tempfile::TempDir, Dispatcher, nfs_fh3, Vec<Vec<u8>>) {
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<Vec<u8>> = (0..300)
        .map(|i: usize| {
            let len = 1 + (i * 37) % 255;
            let mut name = format!("{i}-").into_bytes();
            name.resize(len.max(name.len()), b'x');
            name
        })
        .collect();
    for name in &names {
        std::fs::write(
            dir.path().join(String::from_utf8(name.clone()).unwrap()),
            b"",
        )
        .unwrap();
    }
    names.extend([b".".to_vec(), b"..".to_vec()]);
    names.sort();
    let fs = Arc::new(LocalFs::open(dir.path()).unwrap());
    let export = layerfs_nfs::Export::new(fs, dir.path().as_os_str().as_encoded_bytes()).unwrap();
    let d = Dispatcher::new(layerfs_nfs::programs_for(export));
    let mnt = results(&d, &call_record(1, MOUNT, 1, &xdr_opaque(b"/")));
    let len = u32::from_be_bytes(mnt[4..8].try_into().unwrap()) as usize;
    let root = nfs_fh3 {
        data: nfs3_types::xdr_codec::Opaque::owned(mnt[8..8 + len].to_vec()),
    };
    (dir, d, root, names)
}

/// An entry's directory information as READDIRPLUS's `dircount` counts it:
/// fileid, name, cookie.
fn dir_info(name: &[u8]) -> usize {
    8 + 4 + layerfs_rpc::xdr::padded(name.len()) + 8
}

#[test]
fn readdir_pages_fill_their_count_and_list_every_entry_once() {
    let (_dir, d, root, names) = served();
    let largest = 4 + 8 + 4 + 256 + 8;
    for count in [600, 1024, 4096, 65_536] {
        let (mut seen, mut cookie, mut verf) = (Vec::new(), 0, cookieverf3::default());
        loop {
            let call = READDIR3args {
                dir: root.clone(),
                cookie,
                cookieverf: verf,
                count,
            };
            let bytes = results(&d, &call_record(2, NFS, 16, &args(&call)));
            assert!(
                bytes.len() <= count as usize,
                "{} > count {count}",
                bytes.len()
            );
            let Nfs3Result::Ok(ok) = decode::<READDIR3res>(&bytes) else {
                panic!("READDIR failed at count {count}")
            };
            if !ok.reply.eof {
                assert!(
                    bytes.len() + largest > count as usize,
                    "a page of {} bytes of {count} left room for another entry",
                    bytes.len()
                );
            }
            for e in &ok.reply.entries.0 {
                seen.push(e.name.as_ref().to_vec());
                cookie = e.cookie;
            }
            verf = ok.cookieverf;
            if ok.reply.eof {
                break;
            }
        }
        seen.sort();
        assert_eq!(seen, names, "count {count}");
    }
}

#[test]
fn readdirplus_pages_keep_both_budgets_and_list_every_entry_once() {
    let (_dir, d, root, names) = served();
    for (dircount, maxcount) in [(0, 4096), (512, 65_536), (4096, 8192), (8192, 1 << 20)] {
        let (mut seen, mut cookie, mut verf) = (Vec::new(), 0, cookieverf3::default());
        loop {
            let call = READDIRPLUS3args {
                dir: root.clone(),
                cookie,
                cookieverf: verf,
                dircount,
                maxcount,
            };
            let bytes = results(&d, &call_record(3, NFS, 17, &args(&call)));
            let what = format!("dircount {dircount}, maxcount {maxcount}");
            assert!(
                bytes.len() <= maxcount as usize,
                "{} bytes: {what}",
                bytes.len()
            );
            let Nfs3Result::Ok(ok) = decode::<READDIRPLUS3res>(&bytes) else {
                panic!("READDIRPLUS failed: {what}")
            };
            let entries = &ok.reply.entries.0;
            let info: usize = entries.iter().map(|e| dir_info(e.name.as_ref())).sum();
            if dircount > 0 && entries.len() > 1 {
                assert!(info <= dircount as usize, "{info} bytes of names: {what}");
            }
            for e in entries {
                assert!(e.name_attributes.is_some(), "{what}");
                seen.push(e.name.as_ref().to_vec());
                cookie = e.cookie;
            }
            verf = ok.cookieverf;
            if ok.reply.eof {
                break;
            }
            assert!(!entries.is_empty(), "no progress: {what}");
        }
        seen.sort();
        assert_eq!(seen, names, "dircount {dircount}, maxcount {maxcount}");
    }
}

#[test]
fn a_budget_too_small_for_one_entry_is_toosmall_with_the_directory_attributes() {
    let (_dir, d, root, _) = served();
    let plus = READDIRPLUS3args {
        dir: root.clone(),
        cookie: 0,
        cookieverf: cookieverf3::default(),
        dircount: 0,
        maxcount: 120,
    };
    let bytes = results(&d, &call_record(4, NFS, 17, &args(&plus)));
    let Nfs3Result::Err((status, fail)) = decode::<READDIRPLUS3res>(&bytes) else {
        panic!("READDIRPLUS of 120 bytes succeeded")
    };
    assert_eq!(status, nfsstat3::NFS3ERR_TOOSMALL);
    assert!(fail.dir_attributes.is_some());
    let plain = READDIR3args {
        dir: root,
        cookie: 0,
        cookieverf: cookieverf3::default(),
        count: 100,
    };
    let bytes = results(&d, &call_record(5, NFS, 16, &args(&plain)));
    let Nfs3Result::Err((status, fail)) = decode::<READDIR3res>(&bytes) else {
        panic!("READDIR of 100 bytes succeeded")
    };
    assert_eq!(status, nfsstat3::NFS3ERR_TOOSMALL);
    assert!(fail.dir_attributes.is_some());
}
