//! Lazy layers through the stack: the tree at once and named as the full
//! layer is, data at first read and only what the read needs, every piece
//! checked, nothing fetched twice (across a restart, or shared with
//! another layer), bounds refused.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use layerfs_layers::lazy::{check_pieces, Entry, EntryKind, Fetch, LazyLayer, Piece, Source};
use layerfs_layers::{LayerId, StackFs, Store};
use layerfs_vfs::{Caller, Error, FileId, Filesystem};
use sha2::{Digest, Sha256};

/// A blob of files stored one after another, uncompressed: what a piece
/// asks is cut out of it. Counts what it is asked; can be made to lie.
struct Blob {
    bytes: Vec<u8>,
    asked: AtomicUsize,
    lie: AtomicBool,
    /// The start of the one piece to lie about, if any.
    lie_at: std::sync::atomic::AtomicU64,
    pieces_asked: Mutex<Vec<(u64, u64)>>,
}

impl Fetch for Blob {
    fn fetch(&self, pieces: &[&Piece]) -> std::io::Result<Vec<Vec<u8>>> {
        self.asked.fetch_add(pieces.len(), Ordering::SeqCst);
        Ok(pieces
            .iter()
            .map(|p| {
                self.pieces_asked.lock().unwrap().push((p.start, p.end));
                let mut bytes = self.bytes[p.start as usize..p.end as usize].to_vec();
                if self.lie.load(Ordering::SeqCst) || self.lie_at.load(Ordering::SeqCst) == p.start
                {
                    bytes[0] ^= 1;
                }
                bytes
            })
            .collect())
    }
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The files of a test image: (path, content), pieces of `piece` bytes.
struct Image {
    entries: Vec<Entry>,
    blob: Arc<Blob>,
    files: HashMap<String, Vec<u8>>,
}

fn image(files: &[(&str, Vec<u8>)], piece: usize) -> Image {
    let mut bytes = Vec::new();
    let mut entries = vec![dir("data")];
    for (path, content) in files {
        let mut pieces = Vec::new();
        for (i, chunk) in content.chunks(piece).enumerate() {
            let start = bytes.len() as u64;
            bytes.extend_from_slice(chunk);
            pieces.push(Piece {
                at: (i * piece) as u64,
                len: chunk.len() as u64,
                start,
                end: bytes.len() as u64,
                skip: 0,
                digest: digest(chunk),
            });
        }
        entries.push(Entry {
            path: PathBuf::from(path),
            kind: EntryKind::File {
                size: content.len() as u64,
                content: Sha256::digest(content).into(),
                pieces,
            },
            mode: 0o444,
            uid: 0,
            gid: 0,
            mtime: None,
            xattrs: Vec::new(),
        });
    }
    Image {
        entries,
        blob: Arc::new(Blob {
            bytes,
            asked: AtomicUsize::new(0),
            lie: AtomicBool::new(false),
            lie_at: std::sync::atomic::AtomicU64::new(u64::MAX),
            pieces_asked: Mutex::new(Vec::new()),
        }),
        files: files
            .iter()
            .map(|(p, c)| (p.to_string(), c.clone()))
            .collect(),
    }
}

fn dir(path: &str) -> Entry {
    Entry {
        path: PathBuf::from(path),
        kind: EntryKind::Dir,
        mode: 0o755,
        uid: 0,
        gid: 0,
        mtime: None,
        xattrs: Vec::new(),
    }
}

fn source(blob: &Blob) -> Source {
    let place = serde_json::json!({ "blob": digest(&blob.bytes), "size": blob.bytes.len() });
    Source {
        name: "registry.test/lazy:v1".into(),
        place: place.as_object().unwrap().clone(),
    }
}

/// `n` bytes that repeat nowhere (no two pieces alike), by `seed`.
fn content(n: usize, seed: u8) -> Vec<u8> {
    layerfs_testkit::bytes_from(u64::from(seed), n)
}

fn at(fs: &StackFs, path: &str) -> FileId {
    let mut id = fs.root();
    for name in path.split('/') {
        id = fs
            .lookup(&Caller::root(), id, name.as_bytes())
            .unwrap()
            .fileid;
    }
    id
}

/// `img` imported lazily into `store`, attached with its blob as fetcher,
/// and served under `upper` through the store.
fn lazy_stack(store: &Store, img: &Image, upper: &std::path::Path) -> (LayerId, StackFs) {
    let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();
    store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    let fs = store
        .open_stack_in_upper(&[store.layer_dir(&id)], upper)
        .unwrap();
    (id, fs)
}

/// The store at `root` opened afresh, as the next process opens it: lazy
/// layer `id` of `img` attached and served under `upper`.
fn reopened(
    root: &std::path::Path,
    id: &LayerId,
    img: &Image,
    upper: &std::path::Path,
) -> (Store, Arc<LazyLayer>, StackFs) {
    let store = Store::open(root).unwrap();
    let layer = store.attach_lazy(id, Some(img.blob.clone())).unwrap();
    let fs = store
        .open_stack_in_upper(&[store.layer_dir(id)], upper)
        .unwrap();
    (store, layer, fs)
}

fn read(fs: &StackFs, path: &str, offset: u64, count: usize) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    fs.read(&Caller::root(), at(fs, path), offset, count, &mut out)?;
    Ok(out)
}

#[test]
fn a_lazy_layer_is_named_as_the_full_one_and_reads_bring_only_what_they_need() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    // Pieces larger than a read brings in ahead, so each read asks exactly
    // the pieces it covers.
    const P: usize = 300 * 1024;
    let files = [
        ("data/big", content(6 * P + 100, 1)),
        ("data/small", b"hello\n".to_vec()),
        ("data/empty", Vec::new()),
    ];
    let img = image(&files, P);
    let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();

    // The same tree imported whole has the same name.
    let whole = t.path().join("whole");
    std::fs::create_dir_all(whole.join("data")).unwrap();
    for (path, bytes) in &img.files {
        std::fs::write(whole.join(path), bytes).unwrap();
        let mut perms = std::fs::metadata(whole.join(path)).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o444);
        std::fs::set_permissions(whole.join(path), perms).unwrap();
    }
    let full = Store::open(&t.path().join("full")).unwrap();
    assert_eq!(full.import_dir(&whole).unwrap(), id);

    let layer = store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    assert_eq!(layer.bytes(), (0, 6 * P as u64 + 106));
    let fs = store
        .open_stack_in_upper(&[store.layer_dir(&id)], &t.path().join("upper"))
        .unwrap();
    // Sizes and names come from the tree: nothing fetched.
    let attr = fs.getattr(at(&fs, "data/big")).unwrap();
    assert_eq!(attr.size, 6 * P as u64 + 100);
    assert_eq!(img.blob.asked.load(Ordering::SeqCst), 0);

    // A read of 10 bytes across a piece boundary brings those two pieces.
    let got = read(&fs, "data/big", P as u64 - 5, 10).unwrap();
    assert_eq!(got, img.files["data/big"][P - 5..P + 5]);
    assert_eq!(img.blob.asked.load(Ordering::SeqCst), 2);
    assert_eq!(
        read(&fs, "data/big", P as u64, 100).unwrap(),
        img.files["data/big"][P..P + 100]
    );
    assert_eq!(
        img.blob.asked.load(Ordering::SeqCst),
        2,
        "a piece in is not fetched again"
    );
    assert_eq!(read(&fs, "data/small", 0, 100).unwrap(), b"hello\n");
    assert_eq!(read(&fs, "data/empty", 0, 100).unwrap(), b"");
    assert_eq!(img.blob.asked.load(Ordering::SeqCst), 3);

    // Completion brings the rest; the layer's files are then whole.
    let never = AtomicBool::new(false);
    assert!(layer.complete(1 << 20, &never).unwrap());
    assert_eq!(layer.bytes(), (6 * P as u64 + 106, 6 * P as u64 + 106));
    assert!(read(&fs, "data/big", 0, 7 * P).unwrap() == img.files["data/big"]);
    let on_disk = std::fs::read(store.layer_dir(&id).join("data/big")).unwrap();
    assert!(
        on_disk == img.files["data/big"],
        "the layer's file holds the data"
    );
    assert_eq!(
        img.blob.asked.load(Ordering::SeqCst),
        8,
        "8 pieces in all, each fetched once"
    );
}

#[test]
fn a_read_brings_in_the_files_beside_it_in_its_directory_and_no_others() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = (0..10)
        .map(|i| (format!("data/m{i}.py"), content(10_000, i)))
        .collect();
    files.push(("data/sub/other.py".into(), content(10_000, 99)));
    files.push(("data/z.py".into(), content(10_000, 98)));
    let named: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, c)| (p.as_str(), c.clone())).collect();
    let img = image(&named, 1 << 20);
    let (_, fs) = lazy_stack(&store, &img, &t.path().join("upper"));
    let asked = || img.blob.pieces_asked.lock().unwrap().clone();
    // m3 and the six files after it in data/, in one request; not the one
    // in data/sub, which ends the run; nothing before m3. A damaged piece
    // read along (m5) does not fail m3's read, and is not kept.
    img.blob.lie_at.store(50_000, Ordering::SeqCst);
    assert!(read(&fs, "data/m3.py", 0, 10).unwrap() == img.files["data/m3.py"][..10]);
    assert_eq!(asked().len(), 7, "{:?}", asked());
    assert_eq!(asked()[0], (30_000, 40_000));
    assert_eq!(read(&fs, "data/m5.py", 0, 10), Err(Error::Io));
    img.blob.lie_at.store(u64::MAX, Ordering::SeqCst);
    for name in ["data/m9.py", "data/m4.py", "data/m5.py"] {
        assert!(read(&fs, name, 0, 20_000).unwrap() == img.files[name]);
    }
    assert_eq!(
        asked().len(),
        9,
        "the rest were read ahead, m5 asked twice more: {:?}",
        asked()
    );
    read(&fs, "data/m0.py", 0, 10).unwrap();
    read(&fs, "data/sub/other.py", 0, 10).unwrap();
    assert_eq!(asked().len(), 9 + 3 + 1, "{:?}", asked());
}

#[test]
fn a_piece_that_does_not_match_its_digest_is_never_served_nor_kept() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let img = image(&[("data/f", content(5000, 7))], 4096);
    let (id, fs) = lazy_stack(&store, &img, &t.path().join("upper"));
    img.blob.lie.store(true, Ordering::SeqCst);
    assert_eq!(read(&fs, "data/f", 0, 10), Err(Error::Io));
    // Nothing of it was written: the file is still holes on the host.
    let on_disk = std::fs::read(store.layer_dir(&id).join("data/f")).unwrap();
    assert!(on_disk.iter().all(|&b| b == 0));
    // A copy-up of it fails too, rather than copying holes.
    let f = at(&fs, "data/f");
    let write = fs.write(
        &Caller::root(),
        f,
        0,
        b"x",
        layerfs_vfs::Stability::Unstable,
    );
    assert_eq!(write.err(), Some(Error::Io));
    // The registry mended: the next read works.
    img.blob.lie.store(false, Ordering::SeqCst);
    assert_eq!(read(&fs, "data/f", 0, 5000).unwrap(), img.files["data/f"]);
}

#[test]
fn a_piece_one_layer_has_is_lent_to_another_and_removal_takes_the_state() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("store");
    let shared = content(3000, 9);
    let first = image(
        &[
            ("data/shared", shared.clone()),
            ("other/a", content(2000, 1)),
        ],
        1024,
    );
    let second = image(
        &[
            ("data/shared", shared.clone()),
            ("other/b", content(2000, 2)),
        ],
        1024,
    );
    let (id1, id2) = {
        let store = Store::open(&root).unwrap();
        let id1 = store
            .import_lazy(&first.entries, &source(&first.blob))
            .unwrap();
        let layer = store.attach_lazy(&id1, Some(first.blob.clone())).unwrap();
        let fs = store
            .open_stack_in_upper(&[store.layer_dir(&id1)], &t.path().join("u1"))
            .unwrap();
        assert_eq!(read(&fs, "data/shared", 0, 3000).unwrap(), shared);
        assert_eq!(first.blob.asked.load(Ordering::SeqCst), 3);
        assert!(!layer.is_complete());
        (
            id1,
            store
                .import_lazy(&second.entries, &source(&second.blob))
                .unwrap(),
        )
    };
    // A second layer with the same file takes it from the first, which
    // the store attached (as a daemon attaches all at start): no fetch.
    let store = Store::open(&root).unwrap();
    store.attach_lazy(&id1, None).unwrap();
    store.attach_lazy(&id2, Some(second.blob.clone())).unwrap();
    let fs = store
        .open_stack_in_upper(&[store.layer_dir(&id2)], &t.path().join("u2"))
        .unwrap();
    assert_eq!(read(&fs, "data/shared", 0, 3000).unwrap(), shared);
    assert_eq!(second.blob.asked.load(Ordering::SeqCst), 0);
    assert_eq!(store.lazy_layers().unwrap().len(), 2);
    // Removing a lazy layer removes its state too.
    store.remove(&id1).unwrap();
    assert_eq!(store.lazy_layers().unwrap(), vec![id2]);
}

#[test]
fn write_permission_lent_for_a_piece_and_not_taken_back_is_taken_back_at_attach() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let mut img = image(
        &[("data/ro", content(100, 1)), ("data/rw", content(100, 2))],
        64,
    );
    img.entries[2].mode = 0o644;
    let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();
    let mode = |name: &str| {
        let path = store.layer_dir(&id).join("data").join(name);
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    };
    assert_eq!((mode("ro"), mode("rw")), (0o444, 0o644));
    // A daemon run as a user was killed while it wrote a piece into the
    // read-only file, its write permission lent.
    let lent = std::fs::Permissions::from_mode(0o644);
    std::fs::set_permissions(store.layer_dir(&id).join("data/ro"), lent).unwrap();
    store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    assert_eq!((mode("ro"), mode("rw")), (0o444, 0o644));
}

#[test]
fn a_store_reopened_keeps_what_was_fetched() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("store");
    const P: usize = 300 * 1024;
    let img = image(&[("data/f", content(P * 3, 3))], P);
    let id = {
        let store = Store::open(&root).unwrap();
        let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();
        let layer = store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
        let fs = store
            .open_stack_in_upper(&[store.layer_dir(&id)], &t.path().join("u"))
            .unwrap();
        read(&fs, "data/f", 0, 10).unwrap();
        assert_eq!(layer.bytes(), (P as u64, P as u64 * 3));
        id
    };
    // Another store on the same root reads the layer's state afresh, as
    // the next process does: what was fetched is not fetched again.
    let (_store, layer, fs) = reopened(&root, &id, &img, &t.path().join("u"));
    assert_eq!(layer.bytes(), (P as u64, P as u64 * 3));
    assert_eq!(
        read(&fs, "data/f", 0, 10).unwrap(),
        img.files["data/f"][..10]
    );
    assert_eq!(img.blob.asked.load(Ordering::SeqCst), 1);
    assert_eq!(
        read(&fs, "data/f", P as u64, 10).unwrap(),
        img.files["data/f"][P..P + 10]
    );
    assert_eq!(img.blob.asked.load(Ordering::SeqCst), 2);
}

#[test]
fn written_pieces_are_noted_together_and_a_kill_before_fetches_them_again() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("store");
    const P: usize = 300 * 1024;
    let img = image(&[("data/f", content(P * 3, 4))], P);
    let store = Store::open(&root).unwrap();
    let (id, fs) = lazy_stack(&store, &img, &t.path().join("u"));
    let layer = store.lazy_layer(&id).unwrap();
    let log = root.join("lazy").join(id.as_str()).join("filled");
    let noted = || std::fs::metadata(&log).map_or(0, |m| m.len().saturating_sub(8) / 8);
    // A read is served without waiting for a sync: its piece is written,
    // not noted.
    assert_eq!(
        read(&fs, "data/f", 0, 10).unwrap(),
        img.files["data/f"][..10]
    );
    assert_eq!(layer.bytes(), (P as u64, P as u64 * 3));
    assert_eq!(noted(), 0, "a read's piece noted before its time");
    assert!(!layer.is_complete());
    // A process killed now (nothing let go of) leaves the piece unnoted: the
    // next one fetches it again, and reads it right.
    let killed = (store, layer, fs);
    let (_again, layer2, fs2) = reopened(&root, &id, &img, &t.path().join("u2"));
    assert_eq!(layer2.bytes(), (0, P as u64 * 3));
    assert_eq!(
        read(&fs2, "data/f", 5, 10).unwrap(),
        img.files["data/f"][5..15]
    );
    assert_eq!(img.blob.asked.load(Ordering::SeqCst), 2, "fetched again");
    // Noted, it is durable and in the log, and the layer once completed says
    // so.
    layer2.note_written().unwrap();
    assert_eq!(noted(), 1);
    assert!(layer2.complete(1 << 20, &AtomicBool::new(false)).unwrap());
    assert_eq!(noted(), 3);
    assert!(root
        .join("lazy")
        .join(id.as_str())
        .join("complete")
        .exists());
    std::mem::forget(killed);
}

/// The files of [`torn`]'s layer: pieces of 32 bytes, numbered across
/// both files, so that records name numbers past 255.
const TORN_PIECE: usize = 32;

fn torn_image() -> Image {
    image(
        &[
            ("data/a", content(40 * TORN_PIECE, 4)),
            ("data/b", content(300 * TORN_PIECE, 5)),
        ],
        TORN_PIECE,
    )
}

/// Piece `n` of [`torn_image`]: its file and offset.
fn torn_piece(n: usize) -> (&'static str, usize) {
    match n {
        0..40 => ("data/a", n * TORN_PIECE),
        _ => ("data/b", (n - 40) * TORN_PIECE),
    }
}

/// Writes pieces `numbers` of `img` into the layer's files by hand, as a
/// daemon would have before it noted them.
fn write_pieces(layer: &std::path::Path, img: &Image, numbers: &[usize]) {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    for &n in numbers {
        let (path, at) = torn_piece(n);
        let file = layer.join(path);
        let mode = std::fs::metadata(&file).unwrap().permissions();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        out.write_all_at(&img.files[path][at..at + TORN_PIECE], at as u64)
            .unwrap();
        std::fs::set_permissions(&file, mode).unwrap();
    }
}

/// A record of today's log, by hand: the piece number and its CRC-32.
fn checked_record(n: u32) -> Vec<u8> {
    let mut out = n.to_le_bytes().to_vec();
    out.extend_from_slice(&crc32fast::hash(&n.to_le_bytes()).to_le_bytes());
    out
}

/// Opens a new store on `root` (a restart), reads every file of layer
/// `id` through a stack and compares it with the image.
fn every_file_reads_right(root: &std::path::Path, upper: &std::path::Path, img: &Image, why: &str) {
    let store = Store::open(root).unwrap();
    let id = store.layers().unwrap().remove(0);
    store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    let fs = store
        .open_stack_in_upper(&[store.layer_dir(&id)], upper)
        .unwrap();
    for (path, want) in &img.files {
        let got = read(&fs, path, 0, want.len() + 1).unwrap();
        assert!(&got == want, "{path} read wrong: {why}");
    }
}

/// A log torn by a crash, cut at every byte and followed by records of
/// low and high piece numbers, in today's format and in an earlier
/// layerfs's (4-byte records appended after a torn tail, so read shifted):
/// across two restarts, every file reads as the image has it, never a hole.
#[test]
fn a_torn_log_cut_at_every_byte_never_marks_a_piece_that_never_came() {
    let t = tempfile::tempdir().unwrap();
    let img = torn_image();
    // Pieces whose data is in, low and high numbers among them.
    // Piece 0 after a record cut short is what an earlier layerfs's log
    // read shifted as another piece (339's first byte, then zeros: 83).
    let noted = [1usize, 255, 256, 300, 339];
    let later = [0usize, 2, 338];
    let mut today = b"LFSFILL2".to_vec();
    noted
        .iter()
        .for_each(|&n| today.extend_from_slice(&checked_record(n as u32)));
    let mut earlier = Vec::new();
    noted
        .iter()
        .for_each(|&n| earlier.extend_from_slice(&(n as u32).to_le_bytes()));
    for (format, whole) in [("today's", &today), ("an earlier layerfs's", &earlier)] {
        for cut in 0..=whole.len() {
            let root = t.path().join(format!("{}-{cut}", format.len()));
            let store = Store::open(&root).unwrap();
            let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();
            write_pieces(&store.layer_dir(&id), &img, &noted);
            write_pieces(&store.layer_dir(&id), &img, &later);
            let mut log = whole[..cut].to_vec();
            for &n in &later {
                match format {
                    "today's" => log.extend_from_slice(&checked_record(n as u32)),
                    _ => log.extend_from_slice(&(n as u32).to_le_bytes()),
                }
            }
            let state = root.join("lazy").join(id.as_str());
            std::fs::write(state.join("filled"), &log).unwrap();
            drop(store);
            let why = format!("{format} log cut at {cut}");
            every_file_reads_right(&root, &t.path().join("u1"), &img, &why);
            every_file_reads_right(&root, &t.path().join("u2"), &img, &why);
            let _ = std::fs::remove_dir_all(t.path().join("u1"));
            let _ = std::fs::remove_dir_all(t.path().join("u2"));
        }
    }
}

/// A layer of more than 65,536 pieces: numbers past 16 bits are noted,
/// kept across a restart and served; the pieces around them are fetched.
#[test]
fn a_layer_of_more_than_65536_pieces_keeps_its_high_numbers() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("store");
    const N: usize = 66_000;
    let img = image(&[("data/many", content(N * 8, 6))], 8);
    let high = 65_600usize;
    let id = {
        let store = Store::open(&root).unwrap();
        let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();
        store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
        let fs = store
            .open_stack_in_upper(&[store.layer_dir(&id)], &t.path().join("u"))
            .unwrap();
        let want = &img.files["data/many"][high * 8..high * 8 + 8];
        assert_eq!(read(&fs, "data/many", high as u64 * 8, 8).unwrap(), want);
        id
    };
    let asked = img.blob.asked.load(Ordering::SeqCst);
    let store = Store::open(&root).unwrap();
    let layer = store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    let (local, all) = layer.bytes();
    assert_eq!(all, N as u64 * 8);
    assert!(local >= 8 && local < all, "{local} of {all} bytes in");
    let fs = store
        .open_stack_in_upper(&[store.layer_dir(&id)], &t.path().join("u"))
        .unwrap();
    let want = &img.files["data/many"][high * 8..high * 8 + 8];
    assert_eq!(read(&fs, "data/many", high as u64 * 8, 8).unwrap(), want);
    assert_eq!(
        img.blob.asked.load(Ordering::SeqCst),
        asked,
        "noted, not fetched again"
    );
    let all_of_it = read(&fs, "data/many", 0, N * 8).unwrap();
    assert!(all_of_it == img.files["data/many"]);
}

/// Two stores in one process that hold the same lazy layer: each reads
/// its own files through its own fill, and a read in a store with no file
/// waiting asks the host nothing.
#[test]
fn two_stores_in_one_process_never_see_each_others_layers() {
    let t = tempfile::tempdir().unwrap();
    const P: usize = 300 * 1024;
    let img = image(&[("data/f", content(P * 2, 7))], P);
    let first = Store::open(&t.path().join("one")).unwrap();
    let second = Store::open(&t.path().join("two")).unwrap();
    let id = first.import_lazy(&img.entries, &source(&img.blob)).unwrap();
    assert_eq!(
        second
            .import_lazy(&img.entries, &source(&img.blob))
            .unwrap(),
        id
    );
    // The first store's layer is made whole; the second's waits.
    let whole = first.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    assert!(whole.complete(1 << 20, &AtomicBool::new(false)).unwrap());
    let waiting = second.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    assert!(!waiting.is_complete(), "not the first store's layer");
    let one = first
        .open_stack_in_upper(&[first.layer_dir(&id)], &t.path().join("u1"))
        .unwrap();
    let two = second
        .open_stack_in_upper(&[second.layer_dir(&id)], &t.path().join("u2"))
        .unwrap();
    let want = &img.files["data/f"];
    assert!(read(&two, "data/f", 0, 2 * P).unwrap() == *want);
    assert!(read(&one, "data/f", 0, 2 * P).unwrap() == *want);
    assert_eq!(
        first.lazy().files_looked_up(),
        0,
        "no file of the first waits"
    );
    assert!(second.lazy().files_looked_up() > 0);
}

/// A lazy layer's file opened through the store's stack and kept for a
/// door's open (FUSE keeps it): once its name is gone (removed, or renamed
/// over), what the door reads through it is the file's data, brought in
/// and checked, not the host file's holes.
#[test]
fn a_kept_file_that_loses_its_name_reads_its_data() {
    use layerfs_vfs::HostFiles;
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    const P: usize = 300 * 1024;
    let img = image(
        &[
            ("data/held", content(P + 700, 8)),
            ("data/over", content(5000, 9)),
            ("data/other", content(100, 10)),
        ],
        P,
    );
    let (_, fs) = lazy_stack(&store, &img, &t.path().join("upper"));
    let root = Caller::root();
    let held = at(&fs, "data/held");
    let over = at(&fs, "data/over");
    let dir = at(&fs, "data");
    let kept_held = fs.file_to_keep(held, false).unwrap().unwrap();
    let kept_over = fs.file_to_keep(over, false).unwrap().unwrap();
    fs.remove(&root, dir, b"held").unwrap();
    fs.rename(&root, dir, b"other", dir, b"over").unwrap();
    assert_eq!(fs.getattr(held), Err(Error::Stale));
    let mut got = Vec::new();
    kept_held.read(0, 2 * P, &mut got).unwrap();
    assert!(got == img.files["data/held"], "the removed file");
    got.clear();
    kept_over.read(0, 2 * P, &mut got).unwrap();
    assert!(got == img.files["data/over"], "the file renamed over");
}

/// A lazy layer's file never hands out its descriptor: the door can
/// neither pass it through to the kernel nor change it, whether it was
/// kept for an open or found again in the stack's caches; a file the same
/// open then copies up is the upper's, whole, and is handed out.
#[test]
fn a_lazy_lower_file_never_hands_out_its_descriptor() {
    use layerfs_vfs::HostFiles;
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    const P: usize = 300 * 1024;
    let img = image(&[("data/f", content(2 * P, 12))], P);
    let (_, fs) = lazy_stack(&store, &img, &t.path().join("upper"));
    let f = at(&fs, "data/f");
    let root = Caller::root();
    let lower = fs.file_to_keep(f, false).unwrap().unwrap();
    assert!(lower.whole_host().is_none(), "a kept lower file");
    let again = fs.file_to_keep(f, false).unwrap().unwrap();
    assert!(again.is(&lower), "the stack's cache gives the same file");
    assert!(again.whole_host().is_none(), "the cached lower file");
    assert!(!fs.kept_is_host_file(f, &lower, false));
    assert!(fs.host_file(&root, f, false).unwrap().is_none());
    // Its attributes are still its own, without a byte fetched.
    assert_eq!(lower.host_attr().unwrap().size, 2 * P as u64);
    let upper = fs.file_to_keep(f, true).unwrap().unwrap();
    assert!(upper.whole_host().is_some(), "the copy-up's file");
    assert!(fs.kept_is_host_file(f, &upper, true));
    let mut got = Vec::new();
    upper.read(0, 3 * P, &mut got).unwrap();
    assert!(got == img.files["data/f"], "the copy holds every byte");
}

/// `diff` compares an upper file with a lazy layer's through the fill: a
/// file removed and made again with the same bytes differs in its times,
/// not its data.
#[test]
fn diff_reads_a_lazy_file_through_its_fill() {
    use layerfs_vfs::{Create, SetAttr, Stability};
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    const P: usize = 300 * 1024;
    let img = image(&[("data/f", content(3 * P, 11))], P);
    let (_, fs) = lazy_stack(&store, &img, &t.path().join("upper"));
    let root = Caller::root();
    let dir = at(&fs, "data");
    fs.remove(&root, dir, b"f").unwrap();
    let mode = SetAttr {
        mode: Some(0o444),
        ..SetAttr::default()
    };
    let (made, _) = fs
        .create(&root, dir, b"f", Create::Unchecked(mode))
        .unwrap();
    let bytes = &img.files["data/f"];
    fs.write(&root, made.fileid, 0, bytes, Stability::FileSync)
        .unwrap();
    let changes = fs.diff().unwrap();
    let of_f: Vec<_> = changes.iter().filter(|c| c.path == b"/data/f").collect();
    assert_eq!(of_f.len(), 1, "{changes:?}");
    assert!(!of_f[0].what.contains(&"data"), "{:?}", of_f[0].what);
}

/// A lazy layer still waiting for data is refused to a stack opened
/// without its store: its files would read as their holes.
#[test]
fn a_lazy_layer_is_read_only_through_its_store() {
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let img = image(&[("data/f", content(1000, 12))], 100);
    let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();
    let refused = StackFs::open_in_upper(&[store.layer_dir(&id)], &t.path().join("u"));
    let e = refused.err().expect("opened without its store");
    assert!(e.to_string().contains("lazy layer"), "{e}");
    // Through the store, without a fetcher: what is missing fails, never
    // reads as zeros.
    let fs = store
        .open_stack_in_upper(&[store.layer_dir(&id)], &t.path().join("u"))
        .unwrap();
    assert_eq!(read(&fs, "data/f", 0, 10), Err(Error::Io));
    // Once complete, any stack may read it.
    let layer = store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    assert!(layer.complete(1 << 20, &AtomicBool::new(false)).unwrap());
    drop(fs);
    let fs = StackFs::open_in_upper(&[store.layer_dir(&id)], &t.path().join("u")).unwrap();
    assert!(read(&fs, "data/f", 0, 1000).unwrap() == img.files["data/f"]);
}

#[test]
fn entries_and_pieces_out_of_bounds_are_refused() {
    let piece = |at, len, start, end| Piece {
        at,
        len,
        start,
        end,
        skip: 0,
        digest: digest(b""),
    };
    assert!(check_pieces(&[piece(0, 10, 0, 5)], 10, 100).is_ok());
    let deep = Piece {
        skip: layerfs_layers::lazy::MAX_SKIP + 1,
        ..piece(0, 10, 0, 5)
    };
    assert!(check_pieces(&[deep], 10, 100)
        .unwrap_err()
        .contains("into its stream"));
    assert!(check_pieces(&[piece(0, 10, 90, 101)], 10, 100)
        .unwrap_err()
        .contains("outside the blob"));
    assert!(check_pieces(&[piece(0, 5, 0, 5)], 10, 100)
        .unwrap_err()
        .contains("5 of its 10"));
    assert!(check_pieces(&[piece(1, 9, 0, 5)], 10, 100)
        .unwrap_err()
        .contains("in order"));
    let mut bad = piece(0, 10, 0, 5);
    bad.digest = "md5:00".into();
    assert!(check_pieces(&[bad], 10, 100)
        .unwrap_err()
        .contains("not sha256"));

    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let mut img = image(&[("data/f", content(10, 3))], 4096);
    img.entries.push(Entry {
        path: PathBuf::from("../escape"),
        ..img.entries[1].clone()
    });
    let err = store
        .import_lazy(&img.entries, &source(&img.blob))
        .unwrap_err();
    assert!(err.to_string().contains("outside the layer"), "{err}");
    assert!(store.layers().unwrap().is_empty());
    assert!(store.lazy_layers().unwrap().is_empty());
}

#[test]
fn a_whiteout_under_a_path_the_table_made_a_file_is_dropped_as_in_a_full_pull() {
    // `umoci repack` of a directory turned into a file: d2f, then d2f/.wh.inner.
    let t = tempfile::tempdir().unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let mut img = image(&[("data/d2f", content(100, 4))], 4096);
    let mut whiteout = img.entries[1].clone();
    whiteout.path = PathBuf::from("data/d2f/.wh.inner");
    whiteout.kind = EntryKind::File {
        size: 0,
        content: Sha256::digest(b"").into(),
        pieces: Vec::new(),
    };
    img.entries.push(whiteout);
    let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();
    let d2f = std::fs::symlink_metadata(store.layer_dir(&id).join("data/d2f")).unwrap();
    assert!(d2f.is_file());
}

/// A table big enough to be written side by side: the same tree, to the
/// byte, as the one written in order and as the same files imported whole
/// (the layer's name is its tree's digest), directories the table does not
/// list made too, hard links made once what they name is there.
#[test]
fn a_large_table_written_side_by_side_makes_the_tree_it_would_in_order() {
    let t = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for d in 0..60 {
        for f in 0..90 {
            files.push((format!("top/d{d}/sub/f{f}"), content(f * 7 % 300, d as u8)));
        }
    }
    let names: Vec<(&str, Vec<u8>)> = files.iter().map(|(p, c)| (p.as_str(), c.clone())).collect();
    let mut img = image(&names, 4096);
    // "data" is there; "top" and "top/dN" are not listed, "top/dN/sub" is.
    for d in 0..60 {
        img.entries.push(dir(&format!("top/d{d}/sub")));
    }
    let link = |path: &str, kind: EntryKind| Entry {
        path: PathBuf::from(path),
        kind,
        mode: 0o777,
        uid: 0,
        gid: 0,
        mtime: None,
        xattrs: Vec::new(),
    };
    img.entries.push(link(
        "top/d0/to-f1",
        EntryKind::Symlink(PathBuf::from("sub/f1")),
    ));
    img.entries.push(link(
        "top/d1/again",
        EntryKind::HardLink(PathBuf::from("top/d0/sub/f2")),
    ));
    assert!(img.entries.len() > 4096, "past the side-by-side threshold");
    let store = Store::open(&t.path().join("store")).unwrap();
    let id = store.import_lazy(&img.entries, &source(&img.blob)).unwrap();

    // The same table with one path twice is written in order, the later
    // entry winning: the same tree, since both are the same file.
    let mut twice = img.entries.clone();
    twice.push(twice[1].clone());
    let in_order = Store::open(&t.path().join("in-order")).unwrap();
    assert_eq!(
        in_order.import_lazy(&twice, &source(&img.blob)).unwrap(),
        id
    );

    let whole = t.path().join("whole");
    std::fs::create_dir_all(whole.join("data")).unwrap();
    for (path, bytes) in &files {
        let path = whole.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o444);
        std::fs::set_permissions(&path, perms).unwrap();
    }
    std::os::unix::fs::symlink("sub/f1", whole.join("top/d0/to-f1")).unwrap();
    std::fs::hard_link(whole.join("top/d0/sub/f2"), whole.join("top/d1/again")).unwrap();
    let full = Store::open(&t.path().join("full")).unwrap();
    assert_eq!(full.import_dir(&whole).unwrap(), id);
    let layer = store.layer_dir(&id);
    let a = std::fs::metadata(layer.join("top/d0/sub/f2")).unwrap();
    let b = std::fs::metadata(layer.join("top/d1/again")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2), "one file, two names");

    // Every file's data is still to come, and comes when read.
    let all: u64 = files.iter().map(|(_, c)| c.len() as u64).sum();
    let lazy = store.attach_lazy(&id, Some(img.blob.clone())).unwrap();
    assert_eq!(lazy.bytes(), (0, all));
    let fs = store
        .open_stack_in_upper(&[layer], &t.path().join("upper"))
        .unwrap();
    let (path, want) = &files[5 * 90 + 11];
    assert_eq!(&read(&fs, path, 0, 1000).unwrap(), want);
}
