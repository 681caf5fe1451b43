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
/// macOS' read and write size.
pub const KIB32: usize = 32 << 10;
/// In GETATTR amid WRITE, one call in this many is the GETATTR.
const PROBE_EVERY: u32 = 8;

/// The handles a workload needs on one server.
pub struct Handles {
    root: nfs_fh3,
    file: nfs_fh3,
    big: nfs_fh3,
    /// Not on nfs3_server (see `peers::spawn_nfs3_server`).
    huge: Option<nfs_fh3>,
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
    /// Mounts `path` through the MOUNT service at `mount` and looks up the
    /// tree's files through the NFS service at `nfs`.
    pub fn of(nfs: SocketAddr, mount: SocketAddr, path: &str) -> io::Result<Handles> {
        let root = match unpack::<mountres3>(&call_once(
            mount,
            MOUNT,
            3,
            1,
            &dirpath(Opaque::borrowed(path.as_bytes())),
        )?)? {
            mountres3::Ok(ok) => nfs_fh3 {
                data: Opaque::owned(ok.fhandle.0.to_vec()),
            },
            mountres3::Err(s) => return Err(io::Error::other(format!("MNT {path}: {s}"))),
        };
        Ok(Handles {
            file: lookup(nfs, &root, "file")?,
            big: lookup(nfs, &root, "big")?,
            huge: lookup(nfs, &root, "huge").ok(),
            data: lookup(nfs, &root, "data.bin")?,
            scratch: lookup(nfs, &root, "scratch")?,
            root,
        })
    }
}

impl Handles {
    /// Whether the server holds what `w` needs.
    pub fn serve(&self, w: Workload) -> bool {
        w != Workload::ReaddirPlusHuge || self.huge.is_some()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Null,
    Getattr,
    Lookup,
    Access,
    ReaddirPlus,
    ReaddirPlusHuge,
    Read,
    Read32k,
    Write,
    Write32k,
    GetattrAmidWrites,
    Create,
    Rename,
    Remove,
    Setattr,
}

impl Workload {
    /// In the order they run: RENAME renames what CREATE made and REMOVE
    /// removes what RENAME named.
    pub const ALL: [Workload; 15] = [
        Workload::Null,
        Workload::Getattr,
        Workload::Lookup,
        Workload::Access,
        Workload::ReaddirPlus,
        Workload::ReaddirPlusHuge,
        Workload::Read,
        Workload::Read32k,
        Workload::Write,
        Workload::Write32k,
        Workload::GetattrAmidWrites,
        Workload::Create,
        Workload::Rename,
        Workload::Remove,
        Workload::Setattr,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Null => "NULL",
            Workload::Getattr => "GETATTR",
            Workload::Lookup => "LOOKUP",
            Workload::Access => "ACCESS",
            Workload::ReaddirPlus => "READDIRPLUS 1,000 entries",
            Workload::ReaddirPlusHuge => "READDIRPLUS 100,000 entries (first 1 MiB)",
            Workload::Read => "READ 1 MiB",
            Workload::Read32k => "READ 32 KiB",
            Workload::Write => "WRITE 1 MiB",
            Workload::Write32k => "WRITE 32 KiB",
            Workload::GetattrAmidWrites => "GETATTR amid WRITE 1 MiB (p50 and p99 of the GETATTRs)",
            Workload::Create => "CREATE",
            Workload::Rename => "RENAME",
            Workload::Remove => "REMOVE",
            Workload::Setattr => "SETATTR",
        }
    }

    /// The two depths (calls in flight) it runs at: the one a single
    /// process's calls reach, and a client's full window.
    pub fn depths(self) -> [usize; 2] {
        match self {
            Workload::Read | Workload::Read32k | Workload::Write | Workload::Write32k => [1, 16],
            Workload::GetattrAmidWrites => [4, 16],
            Workload::ReaddirPlus | Workload::ReaddirPlusHuge => [1, 8],
            _ => [1, 32],
        }
    }

    /// Payload bytes a call moves, for MB/s.
    pub fn bytes(self) -> Option<usize> {
        match self {
            Workload::Read | Workload::Write => Some(MIB),
            Workload::Read32k | Workload::Write32k => Some(KIB32),
            // On average: all but one call in PROBE_EVERY write 1 MiB.
            Workload::GetattrAmidWrites => {
                Some(MIB / PROBE_EVERY as usize * (PROBE_EVERY as usize - 1))
            }
            _ => None,
        }
    }

    /// Whether call `seq` is one whose latency is taken apart: in GETATTR
    /// amid WRITE, the GETATTR among the WRITEs, which shows how long a
    /// quick call waits behind large ones on the same connection (a `stat`
    /// during a copy, on a kernel client's one connection).
    pub fn is_probe(self, seq: u32) -> bool {
        self == Workload::GetattrAmidWrites && seq % PROBE_EVERY == PROBE_EVERY - 1
    }

    /// Calls are counted, not timed: CREATE, RENAME and REMOVE each handle
    /// a fixed 2,000 files; the rest run for the round's duration.
    pub fn fixed_calls(self) -> Option<u32> {
        matches!(self, Workload::Create | Workload::Rename | Workload::Remove).then_some(2000)
    }

    /// Call number `seq` of a run, sent as `xid`. CREATE names its file
    /// `c<names + seq>`, RENAME renames it to `r<names + seq>`, REMOVE
    /// removes that; READ and WRITE move on by their size per call.
    pub fn call(self, h: &Handles, payload: &[u8], xid: u32, seq: u32, names: u32) -> Vec<u8> {
        if self == Workload::GetattrAmidWrites {
            let each = if self.is_probe(seq) {
                Workload::Getattr
            } else {
                Workload::Write
            };
            return each.call(h, payload, xid, seq, names);
        }
        let size = self.bytes().unwrap_or(MIB);
        let offset = (seq as usize % (crate::peers::DATA_LEN / size) * size) as u64;
        let made = || format!("c{:07}", names + seq);
        let renamed = || format!("r{:07}", names + seq);
        let in_scratch = |name: &str| diropargs3 {
            dir: h.scratch.clone(),
            name: filename3(Opaque::owned(name.as_bytes().to_vec())),
        };
        let listing = |dir: &nfs_fh3| READDIRPLUS3args {
            dir: dir.clone(),
            cookie: 0,
            cookieverf: cookieverf3::default(),
            dircount: 64 * 1024,
            maxcount: MIB as u32,
        };
        match self {
            Workload::GetattrAmidWrites => {
                let each = match self.is_probe(seq) {
                    true => Workload::Getattr,
                    false => Workload::Write,
                };
                each.call(h, payload, xid, seq, names)
            }
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
            Workload::Setattr => frame_call(
                xid,
                NFS,
                3,
                2,
                &SETATTR3args {
                    object: h.file.clone(),
                    new_attributes: sattr3 {
                        mode: set_mode3::Some(if seq.is_multiple_of(2) { 0o644 } else { 0o600 }),
                        ..sattr3::default()
                    },
                    guard: sattrguard3::None,
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
            Workload::Access => frame_call(
                xid,
                NFS,
                3,
                4,
                &ACCESS3args {
                    object: h.file.clone(),
                    access: 0x3f,
                },
            ),
            Workload::ReaddirPlus => frame_call(xid, NFS, 3, 17, &listing(&h.big)),
            Workload::ReaddirPlusHuge => {
                let huge = h
                    .huge
                    .as_ref()
                    .expect("a server without huge/ is not asked");
                frame_call(xid, NFS, 3, 17, &listing(huge))
            }
            Workload::Read | Workload::Read32k => frame_call(
                xid,
                NFS,
                3,
                6,
                &READ3args {
                    file: h.data.clone(),
                    offset,
                    count: size as u32,
                },
            ),
            Workload::Write | Workload::Write32k => frame_call(
                xid,
                NFS,
                3,
                7,
                &WRITE3args {
                    file: h.data.clone(),
                    offset,
                    count: size as u32,
                    stable: stable_how::UNSTABLE,
                    data: Opaque::borrowed(&payload[offset as usize..][..size]),
                },
            ),
            Workload::Create => frame_call(
                xid,
                NFS,
                3,
                8,
                &CREATE3args {
                    where_: in_scratch(&made()),
                    how: createhow3::UNCHECKED(sattr3::default()),
                },
            ),
            Workload::Remove => frame_call(
                xid,
                NFS,
                3,
                12,
                &REMOVE3args {
                    object: in_scratch(&renamed()),
                },
            ),
            Workload::Rename => frame_call(
                xid,
                NFS,
                3,
                14,
                &RENAME3args {
                    from: in_scratch(&made()),
                    to: in_scratch(&renamed()),
                },
            ),
        }
    }

    /// Checks that one call of this workload succeeds on a server.
    pub fn check(self, addr: SocketAddr, h: &Handles) -> io::Result<()> {
        if self.fixed_calls().is_some() {
            return Ok(());
        }
        let data = crate::peers::data();
        let frame = self.call(h, &data, rpcbench::xid_base(), 0, 0);
        let mut stream = std::net::TcpStream::connect(addr)?;
        std::io::Write::write_all(&mut stream, &frame)?;
        let mut records = layerfs_rpc::Records::new(&stream);
        let reply = records.next_record()?.ok_or(io::ErrorKind::UnexpectedEof)?;
        let bytes = reply.as_bytes();
        match rpcbench::reply_ok(bytes) && self.right(&data, 0, &bytes[rpcbench::REPLY_HEADER..]) {
            true => Ok(()),
            false => Err(io::Error::other(format!("{} failed", self.name()))),
        }
    }

    /// Whether the results of call `seq` (its status was NFS3_OK) are what
    /// it asked for: a READ's count, and on every eighth its data, against
    /// `payload` (what the file holds); a WRITE's count; a listing's
    /// entries (on every eighth, to keep the generator's work small).
    pub fn right(self, payload: &[u8], seq: u32, results: &[u8]) -> bool {
        if self == Workload::GetattrAmidWrites {
            return match self.is_probe(seq) {
                true => Workload::Getattr.right(payload, seq, results),
                false => Workload::Write.right(payload, seq, results),
            };
        }
        let size = self.bytes().unwrap_or(MIB);
        let offset = seq as usize % (crate::peers::DATA_LEN / size) * size;
        let sampled = seq.is_multiple_of(8);
        match self {
            Workload::Read | Workload::Read32k => {
                read_right(results, &payload[offset..][..size], sampled)
            }
            Workload::Write | Workload::Write32k => {
                matches!(unpack::<WRITE3res>(results), Ok(Nfs3Result::Ok(ok)) if ok.count as usize == size)
            }
            Workload::ReaddirPlus | Workload::ReaddirPlusHuge if sampled => {
                let Ok(Nfs3Result::Ok(ok)) = unpack::<READDIRPLUS3res>(results) else {
                    return false;
                };
                let entries = ok.reply.entries.0.len();
                match self {
                    // All of big/ fits in one reply: with or without . and ..
                    Workload::ReaddirPlus => {
                        ok.reply.eof
                            && (entries == crate::peers::BIG_DIR
                                || entries == crate::peers::BIG_DIR + 2)
                    }
                    _ => entries > 0,
                }
            }
            _ => true,
        }
    }
}

/// A READ reply's count and eof are those of `want` (never at the file's
/// end here), and with `data` its bytes are `want`'s. Read by hand: the
/// generator must not copy 1 MiB to look at it.
fn read_right(results: &[u8], want: &[u8], data: bool) -> bool {
    let word = |at: usize| {
        results
            .get(at..at + 4)
            .map(|w| u32::from_be_bytes(w.try_into().expect("4 bytes")))
    };
    // status, post_op_attr (a bool, then 84 bytes of fattr3 if set)
    let mut at = 8 + if word(4) == Some(1) { 84 } else { 0 };
    let (count, _eof, len) = (word(at), word(at + 4), word(at + 8));
    at += 12;
    let n = want.len() as u32;
    if count != Some(n) || len != Some(n) {
        return false;
    }
    !data || results.get(at..at + want.len()) == Some(want)
}
