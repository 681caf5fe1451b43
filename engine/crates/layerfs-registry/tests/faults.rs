//! A lazy layer's reads against a registry that misbehaves on the wire: a
//! bit flipped in a range answer, an answer cut short, the whole blob for a
//! range, 416, no answer at all, and a full disk while a piece is written.
//! Each read gets the right bytes or EIO; nothing unchecked is served or
//! noted; the first read once the fault is gone works.
//!
//! The registry is a few lines of HTTP/1.1 on 127.0.0.1 written here: the
//! faults are malformed answers, which a server library exists to prevent.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use layerfs_layers::{LayerId, StackFs, Store};
use layerfs_registry::{pull, write_layer_blob, BlobFormat, PullOptions, Transport};
use layerfs_testkit::bytes_from;
use layerfs_vfs::{Caller, Error, FileId, Filesystem};
use sha2::{Digest, Sha256};

/// How a range answer goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// 206, one bit of the body flipped.
    FlipBit,
    /// 206 whose Content-Length is the range's, half the body, then the
    /// connection closed.
    CutShort,
    /// 200 and the whole blob, as a registry that ignores Range does.
    WholeBlob,
    /// 416 Range Not Satisfiable.
    NotSatisfiable,
    /// The request read, never answered.
    Stall,
}

/// What a read meets a fault with.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    Right,
    /// EIO without asking again: a piece that does not match its digest.
    FailsAtOnce,
    /// EIO once the registry has been asked again for [`WAIT`].
    FailsAfterTheWait,
}

/// How long a read asks a failing registry again (`LAYERFS_LAZY_WAIT`).
const WAIT: Duration = Duration::from_secs(2);

/// A read's result in a word: "right", "EIO", or what else it was (never
/// the bytes: a failed comparison of megabytes helps no one).
fn summary(got: &Result<Vec<u8>, Error>, want: &[u8]) -> String {
    match got {
        Ok(bytes) if bytes == want => "right".into(),
        Ok(bytes) => {
            let zeros = bytes.iter().filter(|&&b| b == 0).count();
            format!(
                "{} bytes read, {zeros} of them zeros, not its {}",
                bytes.len(),
                want.len()
            )
        }
        Err(Error::Io) => "EIO".into(),
        Err(e) => format!("{e:?}"),
    }
}

/// One image (`test/img:v1`, one layer) served over plain HTTP, its layer
/// blob's range answers spoiled by the fault set.
struct Registry {
    port: u16,
    fault: Arc<Mutex<Fault>>,
    /// Range requests for the layer blob answered with a fault.
    spoiled: Arc<AtomicUsize>,
}

impl Registry {
    fn start(layer: Vec<u8>, layer_info: &layerfs_registry::BlobInfo) -> Registry {
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": host_arch(),
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [layer_info.diff_id]},
        }))
        .unwrap();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest(&config),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": layer_info.media_type,
                "digest": layer_info.digest,
                "size": layer_info.size,
                "annotations": layer_info.annotations.iter().cloned().collect::<HashMap<_, _>>(),
            }],
        }))
        .unwrap();
        let blobs: Arc<HashMap<String, Vec<u8>>> = Arc::new(HashMap::from([
            (digest(&config), config),
            (layer_info.digest.clone(), layer),
        ]));
        let layer_digest = layer_info.digest.clone();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let fault = Arc::new(Mutex::new(Fault::None));
        let spoiled = Arc::new(AtomicUsize::new(0));
        let (f, s) = (fault.clone(), spoiled.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let served = Served {
                    manifest: manifest.clone(),
                    blobs: blobs.clone(),
                    layer: layer_digest.clone(),
                    fault: f.clone(),
                    spoiled: s.clone(),
                };
                std::thread::spawn(move || served.connection(conn));
            }
        });
        Registry {
            port,
            fault,
            spoiled,
        }
    }

    fn reference(&self) -> String {
        format!("127.0.0.1:{}/test/img:v1", self.port)
    }

    fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }
}

/// What one connection's thread answers from.
struct Served {
    manifest: Vec<u8>,
    blobs: Arc<HashMap<String, Vec<u8>>>,
    layer: String,
    fault: Arc<Mutex<Fault>>,
    spoiled: Arc<AtomicUsize>,
}

impl Served {
    /// Answers the requests of one keep-alive connection until it closes
    /// or a fault closes it.
    fn connection(&self, conn: TcpStream) {
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut out = conn;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let mut words = line.split_whitespace();
            let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let (method, path) = (method.to_owned(), path.to_owned());
            let mut range = None;
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 {
                    return;
                }
                let header = header.trim_end();
                if header.is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    if name.eq_ignore_ascii_case("range") {
                        range = parse_range(value.trim());
                    }
                }
            }
            if !self.answer(&mut out, &method, &path, range) {
                return;
            }
        }
    }

    /// Writes the answer to one request; false once the connection is to
    /// be closed.
    fn answer(
        &self,
        out: &mut TcpStream,
        method: &str,
        path: &str,
        range: Option<(u64, u64)>,
    ) -> bool {
        let head_only = method == "HEAD";
        let send = |out: &mut TcpStream, status: &str, headers: &str, body: &[u8]| {
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{headers}\r\n",
                body.len()
            );
            out.write_all(head.as_bytes())?;
            if !head_only {
                out.write_all(body)?;
            }
            out.flush()
        };
        if path == "/v2/" {
            return send(out, "200 OK", "Content-Type: application/json\r\n", b"{}").is_ok();
        }
        if path.ends_with("/manifests/v1") {
            let headers = format!(
                "Content-Type: application/vnd.oci.image.manifest.v1+json\r\nDocker-Content-Digest: {}\r\n",
                digest(&self.manifest)
            );
            return send(out, "200 OK", &headers, &self.manifest).is_ok();
        }
        let Some(blob) = path
            .rsplit_once("/blobs/")
            .and_then(|(_, d)| self.blobs.get(d).map(|b| (d, b)))
        else {
            return send(out, "404 Not Found", "", b"").is_ok();
        };
        let (name, blob) = blob;
        let size = blob.len() as u64;
        let Some((start, last)) = range.map(|(s, l)| (s, l.min(size - 1))) else {
            return send(out, "200 OK", "", blob).is_ok();
        };
        let body = &blob[start as usize..=last as usize];
        let partial = format!("Content-Range: bytes {start}-{last}/{size}\r\n");
        let fault = if name == self.layer {
            *self.fault.lock().unwrap()
        } else {
            Fault::None
        };
        if fault != Fault::None {
            self.spoiled.fetch_add(1, Ordering::SeqCst);
        }
        match fault {
            Fault::None => send(out, "206 Partial Content", &partial, body).is_ok(),
            Fault::FlipBit => {
                let mut flipped = body.to_vec();
                let mid = flipped.len() / 2;
                flipped[mid] ^= 0x10;
                send(out, "206 Partial Content", &partial, &flipped).is_ok()
            }
            Fault::CutShort => {
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\n{partial}\r\n",
                    body.len()
                );
                let _ = out.write_all(head.as_bytes());
                let _ = out.write_all(&body[..body.len() / 2]);
                false
            }
            Fault::WholeBlob => send(out, "200 OK", "", blob).is_ok(),
            Fault::NotSatisfiable => {
                let headers = format!("Content-Range: bytes */{size}\r\n");
                send(out, "416 Range Not Satisfiable", &headers, b"").is_ok()
            }
            Fault::Stall => {
                let until = Instant::now() + Duration::from_secs(20);
                while *self.fault.lock().unwrap() == Fault::Stall && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
                false
            }
        }
    }
}

/// `bytes=FIRST-LAST` (inclusive).
fn parse_range(value: &str) -> Option<(u64, u64)> {
    let (first, last) = value.strip_prefix("bytes=")?.split_once('-')?;
    Some((first.parse().ok()?, last.parse().ok()?))
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A tree of one file per directory (a read brings along only files of its
/// own directory), `big` first: its 9 MB are three of the writer's pieces.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![("big/f".to_owned(), bytes_from(1, 9_000_000))];
    for (i, name) in ["flip", "short", "whole", "416", "stall", "after"]
        .iter()
        .enumerate()
    {
        files.push((
            format!("{name}/f"),
            bytes_from(2 + i as u64, 100_000 + i * 1000),
        ));
    }
    for (path, bytes) in &files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    files
}

/// The registry's one image, pulled lazily into `store`, and its stack,
/// attached as the daemon attaches it.
struct Pulled {
    store: Store,
    id: LayerId,
    fs: StackFs,
}

fn pull_lazily(registry: &Registry, store_dir: &Path, upper: &Path) -> Pulled {
    std::env::set_var("LAYERFS_LAZY_WAIT", WAIT.as_secs().to_string());
    let store = Store::open(store_dir).unwrap();
    let options = PullOptions {
        lazy: true,
        transport: Transport {
            insecure: vec![format!("127.0.0.1:{}", registry.port)],
            ..Default::default()
        },
        ..Default::default()
    };
    let pulled = pull(
        &store,
        &registry.reference(),
        &options,
        &|_| None,
        &mut |_| {},
    )
    .unwrap();
    let id = pulled.layers[0].layer.clone();
    assert!(pulled.layers[0].lazy, "the layer was not pulled lazily");
    let source = store.lazy_source(&id).unwrap();
    let fetch = layerfs_registry::lazy::fetcher(&source, None).unwrap();
    store.attach_lazy(&id, Some(fetch)).unwrap();
    let fs = store
        .open_stack_in_upper(&[store.layer_dir(&id)], upper)
        .unwrap();
    Pulled { store, id, fs }
}

impl Pulled {
    fn read(&self, path: &str) -> Result<Vec<u8>, Error> {
        let mut id: FileId = self.fs.root();
        for name in path.split('/') {
            id = self.fs.lookup(&Caller::root(), id, name.as_bytes())?.fileid;
        }
        let mut out = Vec::new();
        loop {
            let mut chunk = Vec::new();
            let (eof, _) =
                self.fs
                    .read(&Caller::root(), id, out.len() as u64, 1 << 20, &mut chunk)?;
            out.extend_from_slice(&chunk);
            if eof || chunk.is_empty() {
                return Ok(out);
            }
        }
    }

    /// Bytes of the layer's files in and noted.
    fn noted(&self) -> u64 {
        self.store.lazy_layer(&self.id).unwrap().bytes().0
    }
}

fn blob_of(
    files_dir: &Path,
    t: &Path,
    format: BlobFormat,
) -> (Vec<u8>, layerfs_registry::BlobInfo) {
    let out = t.join("blob");
    let info = write_layer_blob(files_dir, &out, format).unwrap();
    (std::fs::read(&out).unwrap(), info)
}

#[test]
fn every_fault_on_the_wire_fails_the_read_or_is_read_through_and_nothing_unchecked_is_kept() {
    for format in [BlobFormat::Estargz, BlobFormat::ZstdChunked] {
        let t = tempfile::tempdir().unwrap();
        let files_dir = t.path().join("files");
        let files: HashMap<String, Vec<u8>> = tree(&files_dir).into_iter().collect();
        let (blob, info) = blob_of(&files_dir, t.path(), format);
        let registry = Registry::start(blob, &info);
        let pulled = pull_lazily(&registry, &t.path().join("store"), &t.path().join("upper"));

        // (directory, fault, what the read gets)
        let cases = [
            ("flip", Fault::FlipBit, Outcome::FailsAtOnce),
            ("short", Fault::CutShort, Outcome::FailsAfterTheWait),
            ("whole", Fault::WholeBlob, Outcome::Right),
            ("416", Fault::NotSatisfiable, Outcome::FailsAfterTheWait),
            ("stall", Fault::Stall, Outcome::FailsAfterTheWait),
        ];
        for (dir, fault, expected) in cases {
            let path = format!("{dir}/f");
            let want = &files[&path];
            let what = format!("{format:?}, {fault:?}");
            let before = pulled.noted();
            let spoiled = registry.spoiled.load(Ordering::SeqCst);
            registry.set(fault);
            let started = Instant::now();
            let got = pulled.read(&path);
            let took = started.elapsed();
            // The kernel follows a failed READ with more at once: they ask
            // once and do not wait again.
            let started = Instant::now();
            let again = pulled.read(&path);
            let took_again = started.elapsed();
            registry.set(Fault::None);
            assert!(
                registry.spoiled.load(Ordering::SeqCst) > spoiled,
                "{what}: the fault never met a request"
            );
            match expected {
                Outcome::Right => {
                    assert_eq!(summary(&got, want), "right", "{what}");
                    assert!(
                        pulled.noted() > before,
                        "{what}: the piece read was not kept"
                    );
                }
                Outcome::FailsAtOnce | Outcome::FailsAfterTheWait => {
                    assert_eq!(summary(&got, want), "EIO", "{what}");
                    assert_eq!(pulled.noted(), before, "{what}: a piece was noted");
                }
            }
            // A registry that keeps failing is asked again for the whole
            // wait; a piece that does not match fails at once.
            match expected {
                Outcome::FailsAfterTheWait => {
                    assert!(took >= WAIT, "{what}: failed after {took:?}")
                }
                _ => assert!(took < WAIT, "{what}: took {took:?}"),
            }
            assert_eq!(
                summary(&again, want),
                summary(&got, want),
                "{what}: asked again"
            );
            assert!(
                took_again < WAIT,
                "{what}: asked again, took {took_again:?}"
            );
            // The fault gone, the very next read is right.
            assert_eq!(
                summary(&pulled.read(&path), want),
                "right",
                "{what}: the read after the fault"
            );
        }

        // A store opened afresh over the same directory, with no way to
        // fetch, serves what was kept and fails the rest: nothing the
        // faults brought was noted.
        let id = pulled.id.clone();
        drop(pulled);
        let store = Store::open(&t.path().join("store")).unwrap();
        let fs = store
            .open_stack_in_upper(&[store.layer_dir(&id)], &t.path().join("upper2"))
            .unwrap();
        let again = Pulled { store, id, fs };
        for (path, bytes) in &files {
            let read_before = cases.iter().any(|(dir, ..)| path == &format!("{dir}/f"));
            let expected = if read_before { "right" } else { "EIO" };
            assert_eq!(
                summary(&again.read(path), bytes),
                expected,
                "{format:?}: {path}"
            );
        }
    }
}

#[test]
fn a_full_disk_while_a_piece_is_written_fails_the_read_and_keeps_nothing() {
    let t = tempfile::tempdir().unwrap();
    let files_dir = t.path().join("files");
    let files: HashMap<String, Vec<u8>> = tree(&files_dir).into_iter().collect();
    let (blob, info) = blob_of(&files_dir, t.path(), BlobFormat::ZstdChunked);
    let registry = Registry::start(blob, &info);
    // The store on a filesystem of 4 MiB: a piece of 4 MiB cannot fit.
    let small = t.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let Some(_mounted) = layerfs_testkit::or_skip(
        layerfs_testkit::Mounted::tmpfs(&small, "4m"),
        "a full disk while a lazy piece is written",
    ) else {
        return;
    };
    let pulled = pull_lazily(&registry, &small.join("store"), &t.path().join("upper"));
    let before = pulled.noted();
    assert_eq!(
        summary(&pulled.read("big/f"), &files["big/f"]),
        "EIO",
        "a piece that found no room"
    );
    assert_eq!(
        pulled.noted(),
        before,
        "a piece that found no room was noted"
    );
    // Room again: the first read works.
    let grown = std::process::Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(grown.success(), "mount -o remount,size=64m");
    assert_eq!(summary(&pulled.read("big/f"), &files["big/f"]), "right");
}
