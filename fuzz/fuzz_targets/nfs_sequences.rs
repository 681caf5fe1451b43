//! Random sequences of well-formed NFS calls through the dispatcher, on a
//! plain directory or a workspace (a lower layer under an upper), each call
//! on a handle an earlier reply handed out, as three callers (root, a user,
//! nobody). Checks what a client relies on: every call is accepted, every
//! reply decodes as its procedure's results and fills its record exactly,
//! and no handle the server gave out comes back BADHANDLE, nor any call IO
//! or SERVERFAULT (on a local filesystem these mean an error the server did
//! not expect).
#![no_main]

use std::sync::Arc;

use layerfs_rpc::{Dispatcher, Outcome};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Pack, Unpack};

#[derive(Arbitrary, Debug)]
enum Op {
    As {
        who: u8,
    },
    Getattr {
        h: u8,
    },
    Setattr {
        h: u8,
        mode: Option<u16>,
        size: Option<u16>,
        guard: bool,
    },
    Lookup {
        dir: u8,
        name: u8,
    },
    Access {
        h: u8,
        bits: u8,
    },
    Readlink {
        h: u8,
    },
    Read {
        h: u8,
        offset: u16,
        count: u16,
    },
    Write {
        h: u8,
        offset: u16,
        len: u8,
        stable: u8,
    },
    Create {
        dir: u8,
        name: u8,
        how: u8,
        mode: u16,
    },
    Mkdir {
        dir: u8,
        name: u8,
        mode: u16,
    },
    Symlink {
        dir: u8,
        name: u8,
        target: u8,
    },
    Mknod {
        dir: u8,
        name: u8,
    },
    Remove {
        dir: u8,
        name: u8,
    },
    Rmdir {
        dir: u8,
        name: u8,
    },
    Rename {
        from: u8,
        name: u8,
        to: u8,
        new_name: u8,
    },
    Link {
        h: u8,
        dir: u8,
        name: u8,
    },
    Readdir {
        dir: u8,
        cookie: u8,
        count: u16,
    },
    Readdirplus {
        dir: u8,
        cookie: u8,
        dircount: u16,
        maxcount: u16,
    },
    Fsstat {
        h: u8,
    },
    Fsinfo {
        h: u8,
    },
    Pathconf {
        h: u8,
    },
    Commit {
        h: u8,
        offset: u16,
        count: u16,
    },
}

const NAMES: [&[u8]; 7] = [b"a", b"b", b"etc", b"f", b"sub", b".wh.x", b".."];
const CALLERS: [(u32, u32); 3] = [(0, 0), (1000, 1000), (65534, 65534)];

struct Session {
    dispatcher: Dispatcher,
    handles: Vec<nfs_fh3>,
    cookies: Vec<u64>,
    verifier: cookieverf3,
    caller: (u32, u32),
    xid: u32,
}

fn name(n: u8) -> filename3<'static> {
    filename3(Opaque::borrowed(NAMES[n as usize % NAMES.len()]))
}

fn mode(m: u16) -> sattr3 {
    sattr3 {
        mode: set_mode3::Some(u32::from(m) & 0o7777),
        ..sattr3::default()
    }
}

impl Session {
    fn handle(&self, n: u8) -> nfs_fh3 {
        self.handles[n as usize % self.handles.len()].clone()
    }

    fn dirop(&self, dir: u8, n: u8) -> diropargs3<'static> {
        diropargs3 {
            dir: self.handle(dir),
            name: name(n),
        }
    }

    fn cookie(&self, n: u8) -> u64 {
        if n == 0 || self.cookies.is_empty() {
            0
        } else {
            self.cookies[n as usize % self.cookies.len()]
        }
    }

    /// Sends procedure `proc` with `args`; returns the results' bytes.
    fn call(&mut self, proc: u32, args: &impl Pack) -> Vec<u8> {
        self.xid = self.xid.wrapping_add(1);
        let (uid, gid) = self.caller;
        let mut record = Vec::new();
        // A call to NFS v3, AUTH_SYS for the caller, no verifier.
        for w in [
            self.xid, 0, 2, 100_003, 3, proc, 1, 20, 0, 0, uid, gid, 0, 0, 0,
        ] {
            record.extend_from_slice(&w.to_be_bytes());
        }
        args.pack(&mut record).unwrap();
        let peer = Some("127.0.0.1".parse().unwrap());
        let Outcome::Reply(reply) = self.dispatcher.handle(&record, peer) else {
            panic!("procedure {proc}: a well-formed call got no reply");
        };
        let bytes = &on_the_wire(&reply);
        assert_eq!(bytes[4..8], self.xid.to_be_bytes(), "the call's xid");
        // REPLY, MSG_ACCEPTED, an empty AUTH_NONE verifier, SUCCESS.
        assert_eq!(
            bytes[8..28],
            [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            "procedure {proc}: not accepted"
        );
        let results = bytes[28..].to_vec();
        let status = u32::from_be_bytes(results[..4].try_into().unwrap());
        for bad in [
            nfsstat3::NFS3ERR_BADHANDLE,
            nfsstat3::NFS3ERR_IO,
            nfsstat3::NFS3ERR_SERVERFAULT,
        ] {
            assert_ne!(status, bad as u32, "procedure {proc} answered {bad:?}");
        }
        results
    }

    /// Sends `proc` with `args` and decodes its results as `R`.
    fn exchange<R: Unpack>(&mut self, proc: u32, args: &impl Pack) -> R {
        let results = self.call(proc, args);
        decoded(proc, &results)
    }

    fn keep(&mut self, handle: &post_op_fh3) {
        if let Nfs3Option::Some(h) = handle {
            if self.handles.len() < 64 {
                self.handles.push(h.clone());
            }
        }
    }
}

/// The bytes a client receives for `frame`: its file tail (a large READ's
/// data, which the server sends from the file) read as the server sends it,
/// zeros where the file has since shrunk, then the XDR padding.
fn on_the_wire(frame: &layerfs_rpc::Frame) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut wire = frame.bytes().to_vec();
    if let Some(tail) = frame.tail() {
        let file = std::fs::File::from(tail.file.try_clone().unwrap());
        let mut data = vec![0; tail.len];
        let mut at = 0;
        while at < data.len() {
            match file
                .read_at(&mut data[at..], tail.offset + at as u64)
                .unwrap()
            {
                0 => break,
                n => at += n,
            }
        }
        wire.extend_from_slice(&data);
    }
    wire.resize(frame.len(), 0);
    wire
}

/// Decodes `bytes` as `T`, which must take every byte.
fn decoded<T: Unpack>(proc: u32, bytes: &[u8]) -> T {
    let mut cursor = std::io::Cursor::new(bytes);
    let (value, read) = T::unpack(&mut cursor)
        .unwrap_or_else(|e| panic!("procedure {proc}: results do not decode: {e:?}"));
    assert_eq!(
        read,
        bytes.len(),
        "procedure {proc}: bytes past the results"
    );
    value
}

fn apply(s: &mut Session, op: &Op) {
    match *op {
        Op::As { who } => s.caller = CALLERS[who as usize % CALLERS.len()],
        Op::Getattr { h } => {
            s.exchange::<GETATTR3res>(
                1,
                &GETATTR3args {
                    object: s.handle(h),
                },
            );
        }
        Op::Setattr {
            h,
            mode: m,
            size,
            guard,
        } => {
            let args = SETATTR3args {
                object: s.handle(h),
                new_attributes: sattr3 {
                    mode: m.map_or(set_mode3::None, |m| set_mode3::Some(u32::from(m) & 0o7777)),
                    size: size.map_or(set_size3::None, |n| set_size3::Some(u64::from(n))),
                    ..sattr3::default()
                },
                guard: if guard {
                    sattrguard3::Some(nfstime3::default())
                } else {
                    sattrguard3::None
                },
            };
            s.exchange::<SETATTR3res>(2, &args);
        }
        Op::Lookup { dir, name: n } => {
            let r = s.call(
                3,
                &LOOKUP3args {
                    what: s.dirop(dir, n),
                },
            );
            if let Nfs3Result::Ok(ok) = decoded::<LOOKUP3res>(3, &r) {
                s.keep(&Nfs3Option::Some(ok.object));
            }
        }
        Op::Access { h, bits } => {
            s.exchange::<ACCESS3res>(
                4,
                &ACCESS3args {
                    object: s.handle(h),
                    access: u32::from(bits) & 0x3f,
                },
            );
        }
        Op::Readlink { h } => {
            s.exchange::<READLINK3res>(
                5,
                &READLINK3args {
                    symlink: s.handle(h),
                },
            );
        }
        Op::Read { h, offset, count } => {
            let args = READ3args {
                file: s.handle(h),
                offset: u64::from(offset),
                count: u32::from(count),
            };
            s.exchange::<READ3res>(6, &args);
        }
        Op::Write {
            h,
            offset,
            len,
            stable,
        } => {
            // Bytes that say where they belong, so a misplaced write shows.
            let data: Vec<u8> = (0..u64::from(len))
                .map(|i| (u64::from(offset) + i) as u8 ^ len)
                .collect();
            let stable = match stable % 3 {
                0 => stable_how::UNSTABLE,
                1 => stable_how::DATA_SYNC,
                _ => stable_how::FILE_SYNC,
            };
            let args = WRITE3args {
                file: s.handle(h),
                offset: u64::from(offset),
                count: u32::from(len),
                stable,
                data: Opaque::borrowed(&data),
            };
            let file = args.file.clone();
            let r = s.call(7, &args);
            if let Nfs3Result::Ok(ok) = decoded::<WRITE3res>(7, &r) {
                assert_eq!(
                    ok.count,
                    u32::from(len),
                    "a short WRITE on a local filesystem"
                );
                // What was acknowledged reads back, whoever wrote it.
                let caller = std::mem::replace(&mut s.caller, CALLERS[0]);
                let read = READ3args {
                    file,
                    offset: u64::from(offset),
                    count: u32::from(len),
                };
                let r = s.call(6, &read);
                s.caller = caller;
                match decoded::<READ3res>(6, &r) {
                    Nfs3Result::Ok(back) => assert_eq!(
                        back.data.as_ref(),
                        &data[..],
                        "a WRITE at {offset} read back otherwise"
                    ),
                    Nfs3Result::Err((status, _)) => {
                        panic!("a file just written does not read: {status:?}")
                    }
                }
            }
        }
        Op::Create {
            dir,
            name: n,
            how,
            mode: m,
        } => {
            let how = match how % 3 {
                0 => createhow3::UNCHECKED(mode(m)),
                1 => createhow3::GUARDED(mode(m)),
                _ => createhow3::EXCLUSIVE(createverf3([how; 8])),
            };
            let r = s.call(
                8,
                &CREATE3args {
                    where_: s.dirop(dir, n),
                    how,
                },
            );
            if let Nfs3Result::Ok(ok) = decoded::<CREATE3res>(8, &r) {
                s.keep(&ok.obj);
            }
        }
        Op::Mkdir {
            dir,
            name: n,
            mode: m,
        } => {
            let r = s.call(
                9,
                &MKDIR3args {
                    where_: s.dirop(dir, n),
                    attributes: mode(m),
                },
            );
            if let Nfs3Result::Ok(ok) = decoded::<MKDIR3res>(9, &r) {
                s.keep(&ok.obj);
            }
        }
        Op::Symlink {
            dir,
            name: n,
            target,
        } => {
            let args = SYMLINK3args {
                where_: s.dirop(dir, n),
                symlink: symlinkdata3 {
                    symlink_attributes: sattr3::default(),
                    symlink_data: nfspath3(Opaque::borrowed(NAMES[target as usize % NAMES.len()])),
                },
            };
            let r = s.call(10, &args);
            if let Nfs3Result::Ok(ok) = decoded::<SYMLINK3res>(10, &r) {
                s.keep(&ok.obj);
            }
        }
        Op::Mknod { dir, name: n } => {
            let args = MKNOD3args {
                where_: s.dirop(dir, n),
                what: mknoddata3::NF3FIFO(sattr3::default()),
            };
            let r = s.call(11, &args);
            if let Nfs3Result::Ok(ok) = decoded::<MKNOD3res>(11, &r) {
                s.keep(&ok.obj);
            }
        }
        Op::Remove { dir, name: n } => {
            s.exchange::<REMOVE3res>(
                12,
                &REMOVE3args {
                    object: s.dirop(dir, n),
                },
            );
        }
        Op::Rmdir { dir, name: n } => {
            s.exchange::<RMDIR3res>(
                13,
                &RMDIR3args {
                    object: s.dirop(dir, n),
                },
            );
        }
        Op::Rename {
            from,
            name: n,
            to,
            new_name,
        } => {
            s.exchange::<RENAME3res>(
                14,
                &RENAME3args {
                    from: s.dirop(from, n),
                    to: s.dirop(to, new_name),
                },
            );
        }
        Op::Link { h, dir, name: n } => {
            s.exchange::<LINK3res>(
                15,
                &LINK3args {
                    file: s.handle(h),
                    link: s.dirop(dir, n),
                },
            );
        }
        Op::Readdir { dir, cookie, count } => {
            let args = READDIR3args {
                dir: s.handle(dir),
                cookie: s.cookie(cookie),
                cookieverf: if cookie == 0 {
                    cookieverf3::default()
                } else {
                    s.verifier.clone()
                },
                count: u32::from(count),
            };
            let r = s.call(16, &args);
            if let Nfs3Result::Ok(ok) = decoded::<READDIR3res>(16, &r) {
                s.verifier = ok.cookieverf;
                s.cookies
                    .extend(ok.reply.entries.0.iter().map(|e| e.cookie));
            }
        }
        Op::Readdirplus {
            dir,
            cookie,
            dircount,
            maxcount,
        } => {
            let args = READDIRPLUS3args {
                dir: s.handle(dir),
                cookie: s.cookie(cookie),
                cookieverf: if cookie == 0 {
                    cookieverf3::default()
                } else {
                    s.verifier.clone()
                },
                dircount: u32::from(dircount),
                maxcount: u32::from(maxcount),
            };
            let r = s.call(17, &args);
            if let Nfs3Result::Ok(ok) = decoded::<READDIRPLUS3res>(17, &r) {
                s.verifier = ok.cookieverf;
                for entry in ok.reply.entries.0.iter() {
                    s.cookies.push(entry.cookie);
                    s.keep(&entry.name_handle);
                }
            }
        }
        Op::Fsstat { h } => {
            s.exchange::<FSSTAT3res>(
                18,
                &FSSTAT3args {
                    fsroot: s.handle(h),
                },
            );
        }
        Op::Fsinfo { h } => {
            s.exchange::<FSINFO3res>(
                19,
                &FSINFO3args {
                    fsroot: s.handle(h),
                },
            );
        }
        Op::Pathconf { h } => {
            s.exchange::<PATHCONF3res>(
                20,
                &PATHCONF3args {
                    object: s.handle(h),
                },
            );
        }
        Op::Commit { h, offset, count } => {
            let args = COMMIT3args {
                file: s.handle(h),
                offset: u64::from(offset),
                count: u32::from(count),
            };
            s.exchange::<COMMIT3res>(21, &args);
        }
    }
    if s.cookies.len() > 256 {
        s.cookies.drain(..128);
    }
}

fuzz_target!(|input: (bool, Vec<Op>)| {
    let (stacked, ops) = input;
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join(if stacked { "lower" } else { "flat" });
    std::fs::create_dir_all(tree.join("etc/sub")).unwrap();
    std::fs::write(tree.join("a"), b"a file").unwrap();
    std::fs::write(tree.join("etc/f"), b"a file in etc").unwrap();
    std::fs::hard_link(tree.join("a"), tree.join("etc/a")).unwrap();
    std::os::unix::fs::symlink("../a", tree.join("etc/b")).unwrap();
    let fs: Arc<dyn layerfs_vfs::Filesystem> = if stacked {
        std::fs::write(tree.join("etc/.wh.x"), b"").unwrap();
        let upper = dir.path().join("upper");
        Arc::new(layerfs_layers::StackFs::open(&[tree], &upper, &dir.path().join("state")).unwrap())
    } else {
        Arc::new(layerfs_vfs::LocalFs::open(&tree).unwrap())
    };
    let dispatcher = layerfs_rpc::Dispatcher::new(layerfs_nfs::programs(fs, b"/").unwrap());
    let mut mnt = Vec::new();
    for w in [1u32, 0, 2, 100_005, 3, 1, 1, 20, 0, 0, 0, 0, 0, 0, 0, 1] {
        mnt.extend_from_slice(&w.to_be_bytes());
    }
    mnt.extend_from_slice(&[b'/', 0, 0, 0]);
    let Outcome::Reply(reply) = dispatcher.handle(&mnt, None) else {
        panic!("MNT")
    };
    let len = layerfs_nfs::FileHandle::LEN;
    let root = reply.bytes()[4 + 24 + 8..4 + 24 + 8 + len].to_vec();
    let mut session = Session {
        dispatcher,
        handles: vec![nfs_fh3 {
            data: Opaque::owned(root),
        }],
        cookies: Vec::new(),
        verifier: cookieverf3::default(),
        caller: CALLERS[0],
        xid: 0,
    };
    for op in ops.iter().take(48) {
        apply(&mut session, op);
    }
});
