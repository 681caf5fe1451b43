//! The layered filesystem against the kernel's overlayfs: random layers and
//! random operations applied to both, then the visible trees compared.
//!
//! Needs root and overlayfs. Without them it says SKIPPED and passes, unless
//! LAYERFS_REQUIRE_MOUNTS=1 (verify.sh sets it as root), where it fails.
//! LAYERFS_DIFF_CASES sets the number of sequences (default 200).
//! LAYERFS_DIFF_DOOR=fuse applies the operations to the stack through a FUSE
//! mount of it (the kernel's FUSE client, its caches, and the door) instead
//! of through the Filesystem trait, and reads it back through the mount.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerfs_layers::StackFs;
use layerfs_testkit::{or_skip, Mounted};
use layerfs_vfs::{
    Attr, Caller, Create, Error, FileId, FileKind, Filesystem, SetAttr, SetTime, Stability,
    Timestamp,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const NAMES: [&str; 3] = ["a", "b", "c"];
/// How many paths `universe` gives.
const PATHS: usize = 12;

#[derive(Clone, Debug)]
enum Entry {
    File(u8),
    Dir,
    OpaqueDir,
    Symlink(u8),
    Whiteout,
    /// A second name for the file at the given path index, if it is one.
    HardLink(usize),
}

#[derive(Clone, Debug)]
enum Op {
    Create(usize, u8),
    Write(usize, u16, u8),
    Truncate(usize, u16),
    Mkdir(usize),
    Rename(usize, usize),
    Unlink(usize),
    Rmdir(usize),
    Link(usize, usize),
    Symlink(u8, usize),
    Chmod(usize, u16),
    Utimes(usize, u32),
}

/// Every path of up to two components over NAMES.
fn universe() -> Vec<Vec<&'static str>> {
    let mut out: Vec<Vec<&str>> = NAMES.iter().map(|n| vec![*n]).collect();
    for depth in 1..2 {
        let prev: Vec<_> = out.iter().filter(|p| p.len() == depth).cloned().collect();
        for p in prev {
            for n in NAMES {
                let mut q = p.clone();
                q.push(n);
                out.push(q);
            }
        }
    }
    out
}

fn content(seed: u8) -> Vec<u8> {
    (0..(seed as usize % 7) * 300)
        .map(|i| (i as u8) ^ seed)
        .collect()
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        4 => any::<u8>().prop_map(Entry::File),
        4 => Just(Entry::Dir),
        1 => Just(Entry::OpaqueDir),
        1 => any::<u8>().prop_map(Entry::Symlink),
        2 => Just(Entry::Whiteout),
        1 => (0..PATHS).prop_map(Entry::HardLink),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let p = || 0..PATHS;
    prop_oneof![
        (p(), any::<u8>()).prop_map(|(a, s)| Op::Create(a, s)),
        (p(), 0..3000u16, any::<u8>()).prop_map(|(a, o, s)| Op::Write(a, o, s)),
        (p(), 0..3000u16).prop_map(|(a, l)| Op::Truncate(a, l)),
        p().prop_map(Op::Mkdir),
        (p(), p()).prop_map(|(a, b)| Op::Rename(a, b)),
        (p(), p()).prop_map(|(a, b)| Op::Rename(a, b)),
        p().prop_map(Op::Unlink),
        p().prop_map(Op::Rmdir),
        // Twice: a link needs a file at one random path and nothing at
        // another, so it succeeds more rarely than the rest.
        (p(), p()).prop_map(|(a, b)| Op::Link(a, b)),
        (p(), p()).prop_map(|(a, b)| Op::Link(a, b)),
        (any::<u8>(), p()).prop_map(|(t, a)| Op::Symlink(t, a)),
        (p(), 0..0o1000u16).prop_map(|(a, m)| Op::Chmod(a, m)),
        (p(), any::<u32>()).prop_map(|(a, t)| Op::Utimes(a, t)),
    ]
}

type LayerSpec = BTreeMap<usize, Entry>;

/// Writes one layer twice: in overlayfs' form (whiteouts as 0/0 character
/// devices, opaque directories by xattr) and in the OCI form layerfs reads.
/// Whiteouts go only where they hide something possible: in directories
/// that merge with one below (overlayfs lists a whiteout in a directory of
/// one layer as an entry that cannot be looked up). Hard links go only in
/// the top layer: overlayfs counts names a higher layer hides in a copied-up
/// file's link count, layerfs counts the names that show.
fn materialize(spec: &LayerSpec, overlay: &Path, oci: &Path, below: &[PathBuf], top: bool) {
    let paths = universe();
    for (&i, e) in spec {
        let rel: PathBuf = paths[i].iter().collect();
        let parent = rel.parent().unwrap();
        let name = rel.file_name().unwrap().to_str().unwrap();
        // Only where the parent is a directory of this layer (or the root).
        let ok = |root: &Path| {
            root.join(parent)
                .symlink_metadata()
                .is_ok_and(|m| m.is_dir())
        };
        if !ok(overlay) || !ok(oci) || overlay.join(&rel).symlink_metadata().is_ok() {
            continue;
        }
        let opaque_above = (1..paths[i].len()).any(|n| {
            let anc = paths.iter().position(|q| q[..] == paths[i][..n]).unwrap();
            matches!(spec.get(&anc), Some(Entry::OpaqueDir))
        });
        // The nearest layer below with anything at the parent has a directory.
        let merges = below
            .iter()
            .rev()
            .find(|b| b.join(parent).symlink_metadata().is_ok())
            .is_some_and(|b| ok(b));
        if matches!(e, Entry::HardLink(_)) && !top {
            continue;
        }
        if matches!(e, Entry::Whiteout) && (opaque_above || !merges) {
            continue;
        }
        for (root, is_overlay) in [(overlay, true), (oci, false)] {
            let at = root.join(&rel);
            match e {
                Entry::File(s) => std::fs::write(&at, content(*s)).unwrap(),
                Entry::Dir => std::fs::create_dir(&at).unwrap(),
                Entry::OpaqueDir => {
                    std::fs::create_dir(&at).unwrap();
                    if is_overlay {
                        rustix::fs::setxattr(
                            &at,
                            "trusted.overlay.opaque",
                            b"y",
                            rustix::fs::XattrFlags::empty(),
                        )
                        .unwrap();
                    } else {
                        std::fs::write(at.join(".wh..wh..opq"), b"").unwrap();
                    }
                }
                Entry::Symlink(t) => std::os::unix::fs::symlink(format!("t{t}"), &at).unwrap(),
                Entry::Whiteout if is_overlay => {
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        &at,
                        rustix::fs::FileType::CharacterDevice,
                        rustix::fs::Mode::empty(),
                        0,
                    )
                    .unwrap();
                }
                Entry::Whiteout => {
                    std::fs::write(root.join(parent).join(format!(".wh.{name}")), b"").unwrap()
                }
                Entry::HardLink(j) => {
                    let target: PathBuf = paths[*j].iter().collect();
                    if root
                        .join(&target)
                        .symlink_metadata()
                        .is_ok_and(|m| m.is_file())
                    {
                        std::fs::hard_link(root.join(&target), &at).unwrap();
                    }
                }
            }
        }
    }
}

/// What a tree shows: path → (kind, mode, size, nlink, link target or data).
type Tree = BTreeMap<String, (char, u32, u64, u32, Vec<u8>)>;

fn host_tree(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let path = format!("{rel}/{name}");
            let m = e.path().symlink_metadata().unwrap();
            let mode = m.permissions().mode() & 0o7777;
            let v = if m.is_dir() {
                stack.push((e.path(), path.clone()));
                ('d', mode, 0, 0, vec![])
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(e.path()).unwrap();
                ('l', 0, 0, 0, t.into_os_string().into_encoded_bytes())
            } else {
                (
                    'f',
                    mode,
                    m.len(),
                    m.nlink() as u32,
                    std::fs::read(e.path()).unwrap(),
                )
            };
            out.insert(path, v);
        }
    }
    out
}

fn stack_tree(fs: &StackFs) -> Tree {
    let who = Caller::root();
    let mut out = Tree::new();
    let mut stack = vec![(fs.root(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let mut cookie = 0;
        loop {
            let page = fs.readdir(&who, dir, cookie, 7, false).unwrap();
            for e in &page.entries {
                cookie = e.cookie;
                if e.name[..] == b"."[..] || e.name[..] == b".."[..] {
                    continue;
                }
                let name = String::from_utf8(e.name.to_vec()).unwrap();
                let path = format!("{rel}/{name}");
                let a = fs.lookup(&who, dir, &e.name).unwrap();
                assert_eq!(
                    a.fileid, e.fileid,
                    "{path}: READDIR and LOOKUP disagree on the id"
                );
                // All but atime: a lower file's attributes are kept from
                // its first LOOKUP, and reading it (as this walk does) may
                // move its atime below.
                let but_atime = |a: Attr| Attr {
                    atime: Timestamp::default(),
                    ..a
                };
                assert_eq!(
                    but_atime(fs.getattr(a.fileid).unwrap()),
                    but_atime(a),
                    "{path}: GETATTR and LOOKUP disagree"
                );
                let v = match a.kind {
                    FileKind::Directory => {
                        stack.push((a.fileid, path.clone()));
                        ('d', a.mode, 0, 0, vec![])
                    }
                    FileKind::Symlink => ('l', 0, 0, 0, fs.readlink(&who, a.fileid).unwrap()),
                    _ => {
                        let mut data = Vec::new();
                        fs.read(&who, a.fileid, 0, a.size as usize + 10, &mut data)
                            .unwrap();
                        ('f', a.mode, a.size, a.nlink, data)
                    }
                };
                out.insert(path, v);
            }
            if page.eof {
                break;
            }
        }
    }
    out
}

/// The id of every visible path.
fn ids(fs: &StackFs) -> BTreeMap<String, FileId> {
    let who = Caller::root();
    let mut out = BTreeMap::new();
    let mut stack = vec![(fs.root(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let page = fs.readdir(&who, dir, 0, 1000, false).unwrap();
        for e in page.entries.iter().filter(|e| e.cookie > 2) {
            let path = format!("{rel}/{}", String::from_utf8_lossy(&e.name));
            if fs.getattr(e.fileid).unwrap().kind == FileKind::Directory {
                stack.push((e.fileid, path.clone()));
            }
            out.insert(path, e.fileid);
        }
    }
    out
}

/// Checks that `op` kept every id it should: a renamed entry and everything
/// under it keep theirs at the new path; all else that still shows keeps its own.
fn check_ids(
    before: &BTreeMap<String, FileId>,
    after: &BTreeMap<String, FileId>,
    op: Option<&Op>,
    paths: &[Vec<&str>],
) -> Result<(), TestCaseError> {
    let Some(op) = op else {
        prop_assert_eq!(before, after, "a failed operation changed ids");
        return Ok(());
    };
    let p = |i: usize| format!("/{}", paths[i].join("/"));
    let under = |path: &str, top: &str| path == top || path.starts_with(&format!("{top}/"));
    for (path, id) in after {
        let was = match *op {
            Op::Rename(a, b) if under(path, &p(b)) => {
                before.get(&format!("{}{}", p(a), &path[p(b).len()..]))
            }
            Op::Rename(a, _) if under(path, &p(a)) => continue,
            Op::Create(a, _) | Op::Mkdir(a) | Op::Symlink(_, a) | Op::Link(_, a)
                if *path == p(a) =>
            {
                continue
            }
            _ => before.get(path),
        };
        if let Some(was) = was {
            prop_assert_eq!(was, id, "{} changed id after {:?}", path, op);
        }
    }
    Ok(())
}

/// The paths of `paths` that `shows` says show, missing ones included, so
/// that a name wrongly taken to be absent (or present) is seen.
fn shown(paths: &[Vec<&str>], shows: impl Fn(&[&str]) -> bool) -> Vec<(String, bool)> {
    paths.iter().map(|p| (p.join("/"), shows(p))).collect()
}

/// Where a path is in the stack: its directory and, if it exists, its id.
fn locate(fs: &StackFs, path: &[&str]) -> Option<(FileId, Option<FileId>)> {
    let who = Caller::root();
    let mut dir = fs.root();
    for name in &path[..path.len() - 1] {
        let a = fs.lookup(&who, dir, name.as_bytes()).ok()?;
        if a.kind != FileKind::Directory {
            return None;
        }
        dir = a.fileid;
    }
    let last = path.last().unwrap().as_bytes();
    Some((dir, fs.lookup(&who, dir, last).ok().map(|a| a.fileid)))
}

/// Applies `op` to the mounted overlay; whether it succeeded.
fn apply_host(m: &Path, op: &Op, paths: &[Vec<&str>]) -> bool {
    let p = |i: usize| m.join(paths[i].iter().collect::<PathBuf>());
    use std::io::{Seek, Write};
    match *op {
        Op::Create(a, s) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(p(a))
            .and_then(|mut f| f.write_all(&content(s)))
            .is_ok(),
        Op::Write(a, off, s) => {
            let Ok(md) = p(a).symlink_metadata() else {
                return false;
            };
            if !md.is_file() {
                return false;
            }
            std::fs::OpenOptions::new()
                .write(true)
                .open(p(a))
                .and_then(|mut f| {
                    f.seek(std::io::SeekFrom::Start(off.into()))?;
                    f.write_all(&content(s | 1))
                })
                .is_ok()
        }
        Op::Truncate(a, l) => {
            let Ok(md) = p(a).symlink_metadata() else {
                return false;
            };
            md.is_file()
                && std::fs::OpenOptions::new()
                    .write(true)
                    .open(p(a))
                    .and_then(|f| f.set_len(l.into()))
                    .is_ok()
        }
        Op::Mkdir(a) => std::fs::create_dir(p(a)).is_ok(),
        Op::Rename(a, b) => std::fs::rename(p(a), p(b)).is_ok(),
        Op::Unlink(a) => std::fs::remove_file(p(a)).is_ok(),
        Op::Rmdir(a) => std::fs::remove_dir(p(a)).is_ok(),
        Op::Link(a, b) => std::fs::hard_link(p(a), p(b)).is_ok(),
        Op::Symlink(t, a) => std::os::unix::fs::symlink(format!("t{t}"), p(a)).is_ok(),
        Op::Chmod(a, mode) => {
            let Ok(md) = p(a).symlink_metadata() else {
                return false;
            };
            !md.file_type().is_symlink()
                && std::fs::set_permissions(p(a), std::fs::Permissions::from_mode(mode.into()))
                    .is_ok()
        }
        Op::Utimes(a, t) => {
            let ts = rustix::fs::Timespec {
                tv_sec: t.into(),
                tv_nsec: 0,
            };
            let times = rustix::fs::Timestamps {
                last_access: ts,
                last_modification: ts,
            };
            rustix::fs::utimensat(
                rustix::fs::CWD,
                p(a),
                &times,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .is_ok()
        }
    }
}

/// Applies `op` to the stack through the Filesystem trait; whether it succeeded.
fn apply_stack(fs: &StackFs, op: &Op, paths: &[Vec<&str>]) -> Result<(), Error> {
    let who = Caller::root();
    let at = |i: usize| locate(fs, &paths[i]).ok_or(Error::NoEnt);
    let name = |i: usize| paths[i].last().unwrap().as_bytes();
    let file = |i: usize| -> Result<FileId, Error> {
        let id = at(i)?.1.ok_or(Error::NoEnt)?;
        match fs.getattr(id)?.kind {
            FileKind::Regular => Ok(id),
            _ => Err(Error::Inval),
        }
    };
    match *op {
        Op::Create(a, s) => {
            let (dir, _) = at(a)?;
            let (attr, _) = fs.create(&who, dir, name(a), Create::Guarded(SetAttr::default()))?;
            fs.write(&who, attr.fileid, 0, &content(s), Stability::Unstable)
                .map(|_| ())
        }
        Op::Write(a, off, s) => fs
            .write(
                &who,
                file(a)?,
                off.into(),
                &content(s | 1),
                Stability::Unstable,
            )
            .map(|_| ()),
        Op::Truncate(a, l) => {
            let set = SetAttr {
                size: Some(l.into()),
                ..SetAttr::default()
            };
            fs.setattr(&who, file(a)?, &set, None).map(|_| ())
        }
        Op::Mkdir(a) => fs
            .mkdir(&who, at(a)?.0, name(a), &SetAttr::default())
            .map(|_| ()),
        Op::Rename(a, b) => fs
            .rename(&who, at(a)?.0, name(a), at(b)?.0, name(b))
            .map(|_| ()),
        Op::Unlink(a) => fs.remove(&who, at(a)?.0, name(a)).map(|_| ()),
        Op::Rmdir(a) => fs.rmdir(&who, at(a)?.0, name(a)).map(|_| ()),
        Op::Link(a, b) => {
            let id = at(a)?.1.ok_or(Error::NoEnt)?;
            fs.link(&who, id, at(b)?.0, name(b)).map(|_| ())
        }
        Op::Symlink(t, a) => fs
            .symlink(
                &who,
                at(a)?.0,
                name(a),
                format!("t{t}").as_bytes(),
                &SetAttr::default(),
            )
            .map(|_| ()),
        Op::Chmod(a, mode) => {
            let id = at(a)?.1.ok_or(Error::NoEnt)?;
            if fs.getattr(id)?.kind == FileKind::Symlink {
                return Err(Error::Inval);
            }
            let set = SetAttr {
                mode: Some(mode.into()),
                ..SetAttr::default()
            };
            fs.setattr(&who, id, &set, None).map(|_| ())
        }
        Op::Utimes(a, t) => {
            let id = at(a)?.1.ok_or(Error::NoEnt)?;
            let ts = SetTime::Client(Timestamp {
                secs: t.into(),
                nanos: 0,
            });
            let set = SetAttr {
                atime: ts,
                mtime: ts,
                ..SetAttr::default()
            };
            fs.setattr(&who, id, &set, None).map(|_| ())
        }
    }
}

/// Operations that succeeded, by kind: the sequences must do something.
static SUCCEEDED: std::sync::Mutex<BTreeMap<String, usize>> =
    std::sync::Mutex::new(BTreeMap::new());

fn overlay_available() -> Result<(), String> {
    let t = tempfile::tempdir().map_err(|e| e.to_string())?;
    let d = |n: &str| {
        let p = t.path().join(n);
        std::fs::create_dir(&p).unwrap();
        p
    };
    let (l, u, w, m) = (d("l"), d("u"), d("w"), d("m"));
    mount(&[l], &u, &w, &m).map(drop)
}

/// An overlay as the comparison needs it: renamed directories redirected,
/// hard links indexed.
fn mount(
    lowers_top_first: &[PathBuf],
    upper: &Path,
    work: &Path,
    at: &Path,
) -> Result<Mounted, String> {
    Mounted::overlay(
        lowers_top_first,
        upper,
        work,
        at,
        "redirect_dir=on,index=on",
    )
}

/// Whether the operations go through a FUSE mount of the stack.
fn through_fuse() -> bool {
    std::env::var("LAYERFS_DIFF_DOOR").as_deref() == Ok("fuse")
}

/// The stack under test, reached through the Filesystem trait or through
/// a FUSE mount of it.
struct Ours {
    fs: Arc<StackFs>,
    #[cfg(target_os = "linux")]
    fuse: Option<layerfs_fuse::Mounted>,
}

impl Ours {
    fn open(lowers: &[PathBuf], upper: &Path, state: &Path, fuse_at: &Path) -> Ours {
        let fs = Arc::new(StackFs::open(lowers, upper, state).unwrap());
        #[cfg(target_os = "linux")]
        let fuse = through_fuse().then(|| {
            let options = layerfs_fuse::Options {
                caching: layerfs_fuse::Caching::Exclusive,
                ..Default::default()
            };
            layerfs_fuse::mount(fs.clone(), fuse_at, &options).unwrap()
        });
        #[cfg(not(target_os = "linux"))]
        let _ = fuse_at;
        Ours {
            fs,
            #[cfg(target_os = "linux")]
            fuse,
        }
    }

    fn mountpoint(&self) -> Option<&Path> {
        #[cfg(target_os = "linux")]
        return self.fuse.as_ref().map(|m| m.mountpoint());
        #[cfg(not(target_os = "linux"))]
        None
    }

    fn tree(&self) -> Tree {
        match self.mountpoint() {
            Some(m) => host_tree(m),
            None => stack_tree(&self.fs),
        }
    }

    /// Every visible path's id: through FUSE, the inode number stat shows.
    fn ids(&self) -> BTreeMap<String, FileId> {
        match self.mountpoint() {
            Some(m) => host_ids(m),
            None => ids(&self.fs),
        }
    }

    /// Whether `path` shows: found by LOOKUP, or by stat through FUSE.
    fn shows(&self, path: &[&str]) -> bool {
        match self.mountpoint() {
            Some(m) => m
                .join(path.iter().collect::<PathBuf>())
                .symlink_metadata()
                .is_ok(),
            None => matches!(locate(&self.fs, path), Some((_, Some(_)))),
        }
    }

    fn apply(&self, op: &Op, paths: &[Vec<&str>]) -> Result<(), String> {
        match self.mountpoint() {
            Some(m) => match apply_host(m, op, paths) {
                true => Ok(()),
                false => Err("failed through FUSE".into()),
            },
            None => apply_stack(&self.fs, op, paths).map_err(|e| format!("{e:?}")),
        }
    }
}

fn host_ids(root: &Path) -> BTreeMap<String, FileId> {
    let mut out = BTreeMap::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let path = format!("{rel}/{}", e.file_name().to_string_lossy());
            let m = e.path().symlink_metadata().unwrap();
            if m.is_dir() {
                stack.push((e.path(), path.clone()));
            }
            out.insert(path, m.ino());
        }
    }
    out
}

#[cfg(target_os = "linux")]
fn fuse_available() -> Result<(), String> {
    if !through_fuse() {
        return Ok(());
    }
    let t = tempfile::tempdir().map_err(|e| e.to_string())?;
    let lower = t.path().join("l");
    let at = t.path().join("m");
    std::fs::create_dir(&lower).unwrap();
    std::fs::create_dir(&at).unwrap();
    let fs = StackFs::open(&[lower], &t.path().join("u"), &t.path().join("s"))
        .map_err(|e| e.to_string())?;
    layerfs_fuse::mount(Arc::new(fs), &at, &Default::default())
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(not(target_os = "linux"))]
fn fuse_available() -> Result<(), String> {
    match through_fuse() {
        true => Err("FUSE is served on Linux only".into()),
        false => Ok(()),
    }
}

fn run_case(layers: &[LayerSpec], ops: &[Op]) -> Result<(), TestCaseError> {
    let paths = universe();
    let t = tempfile::tempdir().unwrap();
    let d = |n: &str| {
        let p = t.path().join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let mut ov_lowers = Vec::new();
    let mut oci_lowers = Vec::new();
    for (i, spec) in layers.iter().enumerate() {
        let (ov, oci) = (d(&format!("ov{i}")), d(&format!("oci{i}")));
        materialize(spec, &ov, &oci, &ov_lowers, i + 1 == layers.len());
        ov_lowers.push(ov);
        oci_lowers.push(oci);
    }
    let m = d("m");
    let top_first: Vec<_> = ov_lowers.iter().rev().cloned().collect();
    let mount =
        mount(&top_first, &d("ov-upper"), &d("ov-work"), &m).map_err(TestCaseError::fail)?;
    let ours = Ours::open(&oci_lowers, &d("upper"), &d("state"), &d("fuse"));
    prop_assert_eq!(host_tree(&m), ours.tree(), "the layers alone differ");
    for (i, op) in ops.iter().enumerate() {
        let before = ours.ids();
        let host = apply_host(&m, op, &paths);
        let result = ours.apply(op, &paths);
        check_ids(&before, &ours.ids(), result.is_ok().then_some(op), &paths)?;
        prop_assert_eq!(
            host,
            result.is_ok(),
            "op {} {:?}: overlayfs {}, layerfs {:?}",
            i,
            op,
            host,
            result
        );
        // After every step, so that nothing kept from before it (a name
        // looked up, a listing, attributes) outlives what the step changed.
        prop_assert_eq!(host_tree(&m), ours.tree(), "after op {} {:?}", i, op);
        prop_assert_eq!(
            shown(&paths, |p| m
                .join(p.iter().collect::<PathBuf>())
                .symlink_metadata()
                .is_ok()),
            shown(&paths, |p| ours.shows(p)),
            "which paths show, after op {} {:?}",
            i,
            op
        );
        let kind = format!("{op:?}");
        let kind = kind.split('(').next().unwrap().to_string();
        *SUCCEEDED.lock().unwrap().entry(kind).or_default() += usize::from(host);
    }
    prop_assert_eq!(host_tree(&m), ours.tree());
    let before = ours.ids();
    drop(ours);
    // Everything again from what was persisted: the same tree, the same ids.
    let ours = Ours::open(&oci_lowers, &d("upper"), &d("state"), &d("fuse"));
    prop_assert_eq!(host_tree(&m), ours.tree(), "after a restart");
    prop_assert_eq!(before, ours.ids(), "ids after a restart");
    drop(mount);
    Ok(())
}

#[test]
fn random_operations_match_overlayfs() {
    if or_skip(overlay_available(), "overlayfs differential").is_none() {
        return;
    }
    // Without the device there is no FUSE to test, root or not; with it,
    // a mount that fails is a failure where mounts are required.
    if through_fuse() && !Path::new("/dev/fuse").exists() {
        let none = Err::<(), _>("no /dev/fuse".to_string());
        if or_skip(none, "overlayfs differential through FUSE").is_none() {
            return;
        }
    }
    if or_skip(fuse_available(), "overlayfs differential through FUSE").is_none() {
        return;
    }
    let cases = std::env::var("LAYERFS_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let layer = || proptest::collection::btree_map(0..PATHS, entry(), 0..10);
    let strategy = (
        proptest::collection::vec(layer(), 1..4),
        proptest::collection::vec(op(), 1..30),
    );
    let kinds = [
        "Create", "Write", "Truncate", "Mkdir", "Rename", "Unlink", "Rmdir", "Link", "Symlink",
        "Chmod", "Utimes",
    ];
    let never_succeeded = || {
        let succeeded = SUCCEEDED.lock().unwrap();
        kinds
            .into_iter()
            .filter(|kind| succeeded.get(*kind).is_none_or(|n| *n == 0))
            .collect::<Vec<_>>()
    };
    // Sequences are random, so a kind that needs a particular state (a
    // link: a file at one path, nothing at another) may succeed in none of
    // one batch; more batches are run then, up to five.
    for _ in 0..5 {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&strategy, |(layers, ops)| run_case(&layers, &ops))
            .unwrap();
        if never_succeeded().is_empty() {
            break;
        }
    }
    eprintln!(
        "operations that succeeded on both, by kind: {:?}",
        SUCCEEDED.lock().unwrap()
    );
    let missing = never_succeeded();
    assert!(
        missing.is_empty(),
        "never succeeded in 5 batches of {cases} sequences: {missing:?}"
    );
}
