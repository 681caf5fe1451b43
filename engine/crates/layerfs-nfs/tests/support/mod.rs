//! An in-process layerfs server over a temporary directory, and clients for it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerfs_rpc::{ServerConfig, ServerHandle};
use layerfs_vfs::LocalFs;
use nfs3_client::tokio::{TokioConnector, TokioIo};
use nfs3_client::{Nfs3Connection, Nfs3ConnectionBuilder};
use nfs3_types::nfs3::*;
use nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_types::xdr_codec::Opaque;
use tokio::net::TcpStream;

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub handle: ServerHandle,
}

impl TestServer {
    pub fn start() -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let handle = serve(dir.path());
        TestServer { dir, handle }
    }

    pub fn port(&self) -> u16 {
        self.handle.local_addr().port()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

pub fn serve(dir: &Path) -> ServerHandle {
    serve_fs(Arc::new(LocalFs::open(dir).unwrap()), dir)
}

/// Serves `fs`, known by the host path `dir`, its handles signed with one
/// key for every server of a test run (as a store keeps its key), so they
/// outlive a restart.
pub fn serve_fs(fs: Arc<dyn layerfs_vfs::Filesystem>, dir: &Path) -> ServerHandle {
    let host_path = dir.as_os_str().as_encoded_bytes();
    let addr = "127.0.0.1:0".parse().unwrap();
    let mut export = layerfs_nfs::Export::new(fs, host_path).unwrap();
    export.key = layerfs_nfs::HandleKey::from_bytes([7; 32]);
    layerfs_nfs::serve_export(export, addr, ServerConfig::default()).unwrap()
}

pub type Conn = Nfs3Connection<TokioIo<TcpStream>>;

pub fn cred(uid: u32, gid: u32) -> opaque_auth<'static> {
    opaque_auth::auth_unix(&auth_unix {
        stamp: 1,
        machinename: Opaque::borrowed(b"test"),
        uid,
        gid,
        gids: [gid].as_slice().into(),
    })
}

pub async fn mount_as(port: u16, uid: u32, gid: u32) -> Conn {
    Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", "/")
        .mount_port(port)
        .nfs3_port(port)
        .connect_from_privileged_port(false)
        .credential(cred(uid, gid))
        .mount()
        .await
        .expect("mount")
}

pub async fn mount(port: u16) -> Conn {
    mount_as(port, 0, 0).await
}

pub fn name(s: &str) -> filename3<'static> {
    filename3(Opaque::owned(s.as_bytes().to_vec()))
}

pub fn dirop(dir: &nfs_fh3, n: &str) -> diropargs3<'static> {
    diropargs3 {
        dir: dir.clone(),
        name: name(n),
    }
}

pub fn status_of<T, E>(res: &Nfs3Result<T, E>) -> nfsstat3 {
    match res {
        Nfs3Result::Ok(_) => nfsstat3::NFS3_OK,
        Nfs3Result::Err((s, _)) => *s,
    }
}

pub async fn lookup(c: &mut Conn, dir: &nfs_fh3, n: &str) -> Result<(nfs_fh3, fattr3), nfsstat3> {
    match c
        .lookup(&LOOKUP3args {
            what: dirop(dir, n),
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => Ok((ok.object, ok.obj_attributes.unwrap())),
        Nfs3Result::Err((s, _)) => Err(s),
    }
}

pub async fn create(c: &mut Conn, dir: &nfs_fh3, n: &str) -> nfs_fh3 {
    let res = c
        .create(&CREATE3args {
            where_: dirop(dir, n),
            how: createhow3::UNCHECKED(sattr3::default()),
        })
        .await
        .unwrap();
    res.unwrap().obj.unwrap()
}

pub async fn mkdir(c: &mut Conn, dir: &nfs_fh3, n: &str) -> Result<nfs_fh3, nfsstat3> {
    match c
        .mkdir(&MKDIR3args {
            where_: dirop(dir, n),
            attributes: sattr3::default(),
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => Ok(ok.obj.unwrap()),
        Nfs3Result::Err((s, _)) => Err(s),
    }
}

pub async fn write(
    c: &mut Conn,
    fh: &nfs_fh3,
    offset: u64,
    data: &[u8],
    stable: stable_how,
) -> WRITE3resok {
    let res = c
        .write(&WRITE3args {
            file: fh.clone(),
            offset,
            count: data.len() as u32,
            stable,
            data: Opaque::borrowed(data),
        })
        .await
        .unwrap();
    res.unwrap()
}

pub async fn read(c: &mut Conn, fh: &nfs_fh3, offset: u64, count: u32) -> (Vec<u8>, bool) {
    let ok = c
        .read(&READ3args {
            file: fh.clone(),
            offset,
            count,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ok.count as usize, ok.data.len());
    (ok.data.to_vec(), ok.eof)
}

pub async fn getattr(c: &mut Conn, fh: &nfs_fh3) -> Result<fattr3, nfsstat3> {
    match c
        .getattr(&GETATTR3args { object: fh.clone() })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => Ok(ok.obj_attributes),
        Nfs3Result::Err((s, _)) => Err(s),
    }
}

/// Every name in a directory through READDIR pages of `count` bytes.
pub async fn list_names(c: &mut Conn, dir: &nfs_fh3, count: u32) -> Vec<String> {
    let mut names = Vec::new();
    let mut cookie = 0;
    let mut verf = cookieverf3::default();
    loop {
        let ok = c
            .readdir(&READDIR3args {
                dir: dir.clone(),
                cookie,
                cookieverf: verf,
                count,
            })
            .await
            .unwrap()
            .unwrap();
        verf = ok.cookieverf;
        for e in &ok.reply.entries.0 {
            names.push(String::from_utf8(e.name.as_ref().to_vec()).unwrap());
            cookie = e.cookie;
        }
        if ok.reply.eof {
            return names;
        }
        assert!(
            !ok.reply.entries.0.is_empty(),
            "a page that is not the last has entries"
        );
    }
}

/// A client that sends calls as raw records, so tests can pipeline and
/// retransmit exactly as they choose.
pub struct RawClient {
    stream: std::net::TcpStream,
    records: layerfs_rpc::Records<std::net::TcpStream>,
}

impl RawClient {
    pub fn connect(port: u16) -> RawClient {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let records = layerfs_rpc::Records::new(stream.try_clone().unwrap());
        RawClient { stream, records }
    }

    /// The framed call, ready to send (AUTH_SYS as root).
    pub fn frame(
        xid: u32,
        prog: u32,
        proc: u32,
        args: &impl nfs3_types::xdr_codec::Pack,
    ) -> Vec<u8> {
        use nfs3_types::rpc::{call_body, msg_body, rpc_msg};
        use nfs3_types::xdr_codec::Pack;
        let msg = rpc_msg {
            xid,
            body: msg_body::CALL(call_body {
                rpcvers: 2,
                prog,
                vers: 3,
                proc,
                cred: cred(0, 0),
                verf: opaque_auth::default(),
            }),
        };
        let mut body = Vec::new();
        msg.pack(&mut body).unwrap();
        args.pack(&mut body).unwrap();
        let mut frame = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.stream.write_all(bytes).unwrap();
    }

    pub fn send(&mut self, xid: u32, proc: u32, args: &impl nfs3_types::xdr_codec::Pack) {
        let frame = Self::frame(xid, 100_003, proc, args);
        self.send_raw(&frame);
    }

    /// The next reply's xid and its results (after an accepted SUCCESS header).
    pub fn recv(&mut self) -> (u32, Vec<u8>) {
        let record = self.records.next_record().unwrap().expect("a reply");
        let bytes = record.as_bytes();
        let word = |i: usize| u32::from_be_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(
            (word(1), word(2), word(5)),
            (1, 0, 0),
            "an accepted, successful reply"
        );
        (word(0), bytes[24..].to_vec())
    }
}

pub fn decode<T: nfs3_types::xdr_codec::Unpack>(bytes: &[u8]) -> T {
    let mut r = bytes;
    T::unpack(&mut r).unwrap().0
}

/// XDR variable-length opaque data: length, bytes, padding.
pub fn xdr_opaque(bytes: &[u8]) -> Vec<u8> {
    let mut out = (bytes.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(bytes);
    out.resize(layerfs_rpc::xdr::padded(out.len()), 0);
    out
}

/// A call record (no record mark) as root over AUTH_SYS with an empty
/// machine name and no groups, for driving a `Dispatcher` directly.
pub fn call_record(xid: u32, prog: u32, proc: u32, args: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for w in [xid, 0, 2, prog, 3, proc, 1, 20, 0, 0, 0, 0, 0, 0, 0] {
        out.extend_from_slice(&w.to_be_bytes());
    }
    out.extend_from_slice(args);
    out
}
