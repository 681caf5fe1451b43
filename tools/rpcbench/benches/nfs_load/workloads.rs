//! The calls each workload sends, with handles looked up on each server.

use std::io;
use std::net::SocketAddr;

use nfs3_types::mount::{dirpath, mountres3};
use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::{Opaque, Unpack};
use rpcbench::{call_once, frame_call};

const NFS: u32 = 100_003;
const MOUNT: u32 = 100_005;
pub const MIB: usize = 1 << 20;

/// The handles a workload needs on one server.
pub struct Handles {
    root: nfs_fh3,
    file: nfs_fh3,
    big: nfs_fh3,
    data: nfs_fh3,
    scratch: nfs_fh3,
}

fn unpack<T: Unpack>(mut bytes: &[u8]) -> io::Result<T> {
    T::unpack(&mut bytes)
        .map(|(v, _)| v)
        .map_err(|e| io::Error::other(e.to_string()))
}

fn lookup(addr: SocketAddr, dir: &nfs_fh3, name: &str) -> io::Result<nfs_fh3> {
    let args = LOOKUP3args {
        what: diropargs3 {
            dir: dir.clone(),
            name: filename3(Opaque::borrowed(name.as_bytes())),
        },
    };
    match unpack::<LOOKUP3res>(&call_once(addr, NFS, 3, 3, &args)?)? {
        Nfs3Result::Ok(ok) => Ok(ok.object),
        Nfs3Result::Err((s, _)) => Err(io::Error::other(format!("LOOKUP {name}: {s}"))),
    }
}

impl Handles {
    pub fn of(addr: SocketAddr) -> io::Result<Handles> {
        let root = match unpack::<mountres3>(&call_once(
            addr,
            MOUNT,
            3,
            1,
            &dirpath(Opaque::borrowed(b"/")),
        )?)? {
            mountres3::Ok(ok) => nfs_fh3 {
                data: Opaque::owned(ok.fhandle.0.to_vec()),
            },
            mountres3::Err(s) => return Err(io::Error::other(format!("MNT: {s}"))),
        };
        Ok(Handles {
            file: lookup(addr, &root, "file")?,
            big: lookup(addr, &root, "big")?,
            data: lookup(addr, &root, "data.bin")?,
            scratch: lookup(addr, &root, "scratch")?,
            root,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Null,
    Getattr,
    Lookup,
    ReaddirPlus,
    Read,
    Write,
    Create,
    Remove,
}

impl Workload {
    pub const ALL: [Workload; 8] = [
        Workload::Null,
        Workload::Getattr,
        Workload::Lookup,
        Workload::ReaddirPlus,
        Workload::Read,
        Workload::Write,
        Workload::Create,
        Workload::Remove,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Null => "NULL",
            Workload::Getattr => "GETATTR",
            Workload::Lookup => "LOOKUP",
            Workload::ReaddirPlus => "READDIRPLUS 1,000 entries",
            Workload::Read => "READ 1 MiB",
            Workload::Write => "WRITE 1 MiB",
            Workload::Create => "CREATE",
            Workload::Remove => "REMOVE",
        }
    }

    /// Payload bytes a call moves, for MB/s.
    pub fn bytes(self) -> Option<usize> {
        matches!(self, Workload::Read | Workload::Write).then_some(MIB)
    }

    /// Calls are counted, not timed: CREATE and REMOVE each make a fixed
    /// 2,000 files; the rest run for the round's duration.
    pub fn fixed_calls(self) -> Option<u32> {
        matches!(self, Workload::Create | Workload::Remove).then_some(2000)
    }

    /// Call number `seq` of a run, sent as `xid`; CREATE and REMOVE name
    /// their file `c<names + seq>`, READ and WRITE move on a MiB per call.
    pub fn call(self, h: &Handles, payload: &[u8], xid: u32, seq: u32, names: u32) -> Vec<u8> {
        let offset = (seq as usize % (crate::peers::DATA_LEN / MIB) * MIB) as u64;
        let name = format!("c{:06}", names + seq);
        match self {
            Workload::Null => frame_call(xid, NFS, 3, 0, &nfs3_types::xdr_codec::Void),
            Workload::Getattr => frame_call(
                xid,
                NFS,
                3,
                1,
                &GETATTR3args {
                    object: h.file.clone(),
                },
            ),
            Workload::Lookup => frame_call(
                xid,
                NFS,
                3,
                3,
                &LOOKUP3args {
                    what: diropargs3 {
                        dir: h.root.clone(),
                        name: filename3(Opaque::borrowed(b"file")),
                    },
                },
            ),
            Workload::ReaddirPlus => frame_call(
                xid,
                NFS,
                3,
                17,
                &READDIRPLUS3args {
                    dir: h.big.clone(),
                    cookie: 0,
                    cookieverf: cookieverf3::default(),
                    dircount: 64 * 1024,
                    maxcount: MIB as u32,
                },
            ),
            Workload::Read => frame_call(
                xid,
                NFS,
                3,
                6,
                &READ3args {
                    file: h.data.clone(),
                    offset,
                    count: MIB as u32,
                },
            ),
            Workload::Write => frame_call(
                xid,
                NFS,
                3,
                7,
                &WRITE3args {
                    file: h.data.clone(),
                    offset,
                    count: MIB as u32,
                    stable: stable_how::UNSTABLE,
                    data: Opaque::borrowed(payload),
                },
            ),
            Workload::Create => frame_call(
                xid,
                NFS,
                3,
                8,
                &CREATE3args {
                    where_: diropargs3 {
                        dir: h.scratch.clone(),
                        name: filename3(Opaque::borrowed(name.as_bytes())),
                    },
                    how: createhow3::UNCHECKED(sattr3::default()),
                },
            ),
            Workload::Remove => frame_call(
                xid,
                NFS,
                3,
                12,
                &REMOVE3args {
                    object: diropargs3 {
                        dir: h.scratch.clone(),
                        name: filename3(Opaque::borrowed(name.as_bytes())),
                    },
                },
            ),
        }
    }

    /// Checks that one call of this workload succeeds on a server.
    pub fn check(self, addr: SocketAddr, h: &Handles) -> io::Result<()> {
        if matches!(self, Workload::Create | Workload::Remove) {
            return Ok(());
        }
        let frame = self.call(h, &vec![1; MIB], rpcbench::xid_base(), 0, 0);
        let mut stream = std::net::TcpStream::connect(addr)?;
        std::io::Write::write_all(&mut stream, &frame)?;
        let mut records = layerfs_rpc::Records::new(&stream);
        let reply = records.next_record()?.ok_or(io::ErrorKind::UnexpectedEof)?;
        match rpcbench::reply_ok(reply.as_bytes()) {
            true => Ok(()),
            false => Err(io::Error::other(format!("{} failed", self.name()))),
        }
    }
}
