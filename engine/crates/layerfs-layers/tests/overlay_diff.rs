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
            if !matches!(e, Entry::Whiteout | Entry::HardLink(_)) {
                own(&at, i);
            }
        }
    }
}

/// What a tree shows of one path.
#[derive(Debug, PartialEq, Eq)]
struct Shown {
    kind: char,
    /// Permission bits (0 for a symlink).
    mode: u32,
    size: u64,
    /// Directories too: a merged one reports 1, others their own count.
    nlink: u32,
    owner: (u32, u32),
    /// Seconds of a modification time set to a moment far from now (by
    /// Utimes); `None` for one set by the run itself, whose two sides
    /// happen moments apart.
    mtime: Option<i64>,
    /// A symlink's target or a file's bytes.
    data: Vec<u8>,
}

/// What a tree shows: path → what shows there.
type Tree = BTreeMap<String, Shown>;

/// The modification time at `secs` as [`Shown`] keeps it.
fn set_time(secs: i64) -> Option<i64> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    ((secs - now).abs() > 3600).then_some(secs)
}

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
            let shown = |kind, mode, size, data| Shown {
                kind,
                mode,
                size,
                nlink: m.nlink() as u32,
                owner: (m.uid(), m.gid()),
                mtime: set_time(m.mtime()),
                data,
            };
            let v = if m.is_dir() {
                stack.push((e.path(), path.clone()));
                shown('d', mode, 0, vec![])
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(e.path()).unwrap();
                shown('l', 0, 0, t.into_os_string().into_encoded_bytes())
            } else {
                shown('f', mode, m.len(), std::fs::read(e.path()).unwrap())
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
                // All but atime and the blocks used: a lower file's
                // attributes are kept from its first LOOKUP, and reading it
                // (as this walk does) may move its atime below; and the
                // host may change the block count of a file just written
                // between two stats as it writes the file back (seen once,
                // on an ext4 /tmp beside two fuzzers: 4096 bytes at the
                // LOOKUP, 0 at the GETATTR just after, all else equal).
                let but_atime = |a: Attr| Attr {
                    atime: Timestamp::default(),
                    used: 0,
                    ..a
                };
                assert_eq!(
                    but_atime(fs.getattr(a.fileid).unwrap()),
                    but_atime(a),
                    "{path}: GETATTR and LOOKUP disagree"
                );
                let shown = |kind, mode, size, data| Shown {
                    kind,
                    mode,
                    size,
                    nlink: a.nlink,
                    owner: (a.uid, a.gid),
                    mtime: set_time(a.mtime.secs),
                    data,
                };
                let v = match a.kind {
                    FileKind::Directory => {
                        stack.push((a.fileid, path.clone()));
                        shown('d', a.mode & 0o7777, 0, vec![])
                    }
                    FileKind::Symlink => shown('l', 0, 0, fs.readlink(&who, a.fileid).unwrap()),
                    _ => {
                        let mut data = Vec::new();
                        fs.read(&who, a.fileid, 0, a.size as usize + 10, &mut data)
                            .unwrap();
                        shown('f', a.mode & 0o7777, a.size, data)
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

/// Where a path is in the stack: its directory and, if it exists, its id,
/// looked up as `who` (a directory it may not search fails the walk, as it
/// does a process's).
fn locate(fs: &StackFs, path: &[&str], who: &Caller) -> Result<(FileId, Option<FileId>), Error> {
    let mut dir = fs.root();
    for name in &path[..path.len() - 1] {
        let a = fs.lookup(who, dir, name.as_bytes())?;
        if a.kind != FileKind::Directory {
            return Err(Error::NotDir);
        }
        dir = a.fileid;
    }
    let last = path.last().unwrap().as_bytes();
    match fs.lookup(who, dir, last) {
        Ok(a) => Ok((dir, Some(a.fileid))),
        Err(Error::NoEnt) => Ok((dir, None)),
        Err(e) => Err(e),
    }
}

/// Why an operation applied through a mount failed: its errno, or `NOT_TRIED`
/// where the test itself declined it (a write to what is not a file).
type Errno = i32;
const NOT_TRIED: Errno = -1;

fn errno(r: std::io::Result<()>) -> Result<(), Errno> {
    r.map_err(|e| e.raw_os_error().unwrap_or(NOT_TRIED))
}

/// Applies `op` to a mounted tree (the overlay, or the stack through FUSE).
fn apply_host(m: &Path, op: &Op, paths: &[Vec<&str>]) -> Result<(), Errno> {
    let p = |i: usize| m.join(paths[i].iter().collect::<PathBuf>());
    let regular = |i: usize| match p(i).symlink_metadata() {
        Ok(md) if md.is_file() => Ok(()),
        Ok(_) => Err(NOT_TRIED),
        Err(e) => Err(e.raw_os_error().unwrap_or(NOT_TRIED)),
    };
    use std::io::{Seek, Write};
    match *op {
        Op::Create(a, s) => errno(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p(a))
                .and_then(|mut f| f.write_all(&content(s))),
        ),
        Op::Write(a, off, s) => {
            regular(a)?;
            errno(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p(a))
                    .and_then(|mut f| {
                        f.seek(std::io::SeekFrom::Start(off.into()))?;
                        f.write_all(&content(s | 1))
                    }),
            )
        }
        Op::Truncate(a, l) => {
            regular(a)?;
            errno(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p(a))
                    .and_then(|f| f.set_len(l.into())),
            )
        }
        Op::Mkdir(a) => errno(std::fs::create_dir(p(a))),
        Op::Rename(a, b) => errno(std::fs::rename(p(a), p(b))),
        Op::Unlink(a) => errno(std::fs::remove_file(p(a))),
        Op::Rmdir(a) => errno(std::fs::remove_dir(p(a))),
        Op::Link(a, b) => errno(std::fs::hard_link(p(a), p(b))),
        Op::Symlink(t, a) => errno(std::os::unix::fs::symlink(format!("t{t}"), p(a))),
        Op::Chmod(a, mode) => {
            match p(a).symlink_metadata() {
                Ok(md) if md.file_type().is_symlink() => return Err(NOT_TRIED),
                Ok(_) => {}
                Err(e) => return Err(e.raw_os_error().unwrap_or(NOT_TRIED)),
            }
            errno(std::fs::set_permissions(
                p(a),
                std::fs::Permissions::from_mode(mode.into()),
            ))
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
            .map_err(|e| e.raw_os_error())
        }
    }
}

/// Applies `op` to the stack through the Filesystem trait; whether it succeeded.
fn apply_stack(fs: &StackFs, op: &Op, paths: &[Vec<&str>], who: &Caller) -> Result<(), Error> {
    let who = who.clone();
    let at = |i: usize| locate(fs, &paths[i], &who);
    let name = |i: usize| paths[i].last().unwrap().as_bytes();
    let file = |i: usize| -> Result<FileId, Error> {
        let id = at(i)?.1.ok_or(Error::NoEnt)?;
        match fs.getattr(id)?.kind {
            FileKind::Regular => Ok(id),
            _ => Err(Error::Inval),
        }
    };
    // A process writes a file it opened for writing: the kernel's open
    // checks write permission (the owner's too) before any WRITE or SETATTR
    // reaches a door, which lets an owner write past the mode (NFS' owner
    // override) for opens made before a chmod.
    let writable = |i: usize| -> Result<FileId, Error> {
        let id = file(i)?;
        match layerfs_vfs::access::permits(&fs.getattr(id)?, &who, layerfs_vfs::access::Perm::WRITE)
        {
            true => Ok(id),
            false => Err(Error::Access),
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
                writable(a)?,
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
            fs.setattr(&who, writable(a)?, &set, None).map(|_| ())
        }
        Op::Mkdir(a) => fs
            .mkdir(&who, at(a)?.0, name(a), &SetAttr::default())
            .map(|_| ()),
        // The kernel answers a rename of a name onto itself, or onto
        // another name of the same file, without asking any filesystem
        // (it does nothing), once both paths are reached.
        Op::Rename(a, b) if a == b => at(a)?.1.map(drop).ok_or(Error::NoEnt),
        Op::Rename(a, b) if at(a)?.1.is_some() && at(a)?.1 == at(b)?.1 => Ok(()),
        Op::Rename(a, b) => fs
            .rename(&who, at(a)?.0, name(a), at(b)?.0, name(b))
            .map(|_| ()),
        Op::Unlink(a) => fs.remove(&who, at(a)?.0, name(a)).map(|_| ()),
        Op::Rmdir(a) => fs.rmdir(&who, at(a)?.0, name(a)).map(|_| ()),
        Op::Link(a, b) => {
            let id = at(a)?.1.ok_or(Error::NoEnt)?;
            let dir = at(b)?.0;
            // What the kernel checks before any filesystem is asked
            // (fs.protected_hardlinks, on by default), as it does in front
            // of both doors: a caller links only files of their own, or
            // plain files they may read and write.
            let attr = fs.getattr(id)?;
            let safe_source = attr.kind == FileKind::Regular
                && attr.mode & 0o4000 == 0
                && attr.mode & 0o2010 != 0o2010
                && layerfs_vfs::access::permits(
                    &attr,
                    &who,
                    layerfs_vfs::access::Perm::READ | layerfs_vfs::access::Perm::WRITE,
                );
            if !who.is_root() && who.uid != attr.uid && !safe_source {
                return Err(Error::Perm);
            }
            fs.link(&who, id, dir, name(b)).map(|_| ())
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
type Succeeded = std::sync::Mutex<BTreeMap<String, usize>>;

/// The user a run as a caller who is not root acts as: uid 1000, in group
/// 1000, which owns some of the layers' files (see [`own`]).
const USER: u32 = 1000;

/// Gives the layers' entry at path index `index` its owner: the user at
/// even indexes, root in the user's group at odd ones.
fn own(at: &Path, index: usize) {
    let uid = if index.is_multiple_of(2) { USER } else { 0 };
    rustix::fs::chownat(
        rustix::fs::CWD,
        at,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(USER)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

/// Who the operations are applied as.
fn caller(user: bool) -> Caller {
    match user {
        false => Caller::root(),
        true => Caller {
            uid: USER,
            gid: USER,
            gids: [USER].into_iter().collect(),
        },
    }
}

/// Runs `f` on this thread as the user (uid, gid and groups), with root's
/// privileges dropped and taken back after: Linux keeps credentials per
/// thread, so the rest of the test (and the FUSE door's threads) stay root.
fn as_caller<T>(user: bool, f: impl FnOnce() -> T) -> T {
    use rustix::fs::{Gid, Uid};
    use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
    if !user {
        return f();
    }
    set_thread_groups(&[Gid::from_raw(USER)]).unwrap();
    set_thread_res_gid(Gid::ROOT, Gid::from_raw(USER), Gid::ROOT).unwrap();
    set_thread_res_uid(Uid::ROOT, Uid::from_raw(USER), Uid::ROOT).unwrap();
    let out = f();
    set_thread_res_uid(Uid::ROOT, Uid::ROOT, Uid::ROOT).unwrap();
    set_thread_res_gid(Gid::ROOT, Gid::ROOT, Gid::ROOT).unwrap();
    set_thread_groups(&[]).unwrap();
    out
}

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
    /// The stack's directories, lowers then upper: where a directory is
    /// merged from more than one, its link count is not counted.
    layers: Vec<PathBuf>,
    #[cfg(target_os = "linux")]
    fuse: Option<layerfs_fuse::Mounted>,
}

impl Ours {
    fn open(lowers: &[PathBuf], upper: &Path, state: &Path, fuse_at: &Path, user: bool) -> Ours {
        // A FUSE mount of the stack before a restart may still be letting
        // go of it (a lazy unmount while the kernel was busy with it): its
        // claim on the upper then ends a moment later.
        let mut tries = 0;
        let fs = loop {
            match StackFs::open(lowers, upper, state) {
                Ok(fs) => break Arc::new(fs),
                Err(e) if e.to_string().contains(layerfs_layers::IN_USE) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        };
        #[cfg(target_os = "linux")]
        let fuse = through_fuse().then(|| {
            let options = layerfs_fuse::Options {
                caching: layerfs_fuse::Caching::Exclusive,
                // The user reaches a mount root made.
                allow_other: user,
                ..Default::default()
            };
            layerfs_fuse::mount(fs.clone(), fuse_at, &options).unwrap()
        });
        #[cfg(not(target_os = "linux"))]
        let _ = (fuse_at, user);
        let mut layers = lowers.to_vec();
        layers.push(upper.to_path_buf());
        Ours {
            fs,
            layers,
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

    /// [`Ours::tree`], with a directory's link count taken as agreeing
    /// where one side reports 1 (what both report for a directory they
    /// merge: "not counted") and the other the directory's true count.
    fn tree_beside(&self, theirs: &Tree) -> Tree {
        let mut ours = self.tree();
        let subdirs = |tree: &Tree, dir: &str| {
            tree.iter()
                .filter(|(p, v)| {
                    v.kind == 'd'
                        && p.strip_prefix(dir)
                            .and_then(|rest| rest.strip_prefix('/'))
                            .is_some_and(|rest| !rest.contains('/'))
                })
                .count() as u32
        };
        let counted: Vec<String> = ours
            .iter()
            .filter(|(path, v)| {
                v.kind == 'd'
                    && theirs
                        .get(*path)
                        .is_some_and(|t| t.kind == 'd' && t.nlink == 1)
                    && v.nlink == 2 + subdirs(&ours, path)
            })
            .map(|(path, _)| path.clone())
            .collect();
        for path in counted {
            ours.get_mut(&path).expect("listed above").nlink = 1;
        }
        // And the other way: layerfs merges a directory overlayfs keeps in
        // one layer where removing a name of a lower hard-linked file
        // copies the file's other names up (overlayfs indexes it instead).
        // Only a directory layerfs does merge (one in two layers or more)
        // may report 1.
        let merged = |path: &str| {
            let rel = path.trim_start_matches('/');
            let is_dir = |layer: &PathBuf| layer.join(rel).is_dir();
            self.layers.iter().filter(|l| is_dir(l)).count() >= 2
        };
        let uncounted: Vec<(String, u32)> = ours
            .iter()
            .filter_map(|(path, v)| {
                let t = theirs.get(path)?;
                (v.kind == 'd'
                    && t.kind == 'd'
                    && v.nlink == 1
                    && merged(path)
                    && t.nlink == 2 + subdirs(theirs, path))
                .then(|| (path.clone(), t.nlink))
            })
            .collect();
        for (path, nlink) in uncounted {
            ours.get_mut(&path).expect("listed above").nlink = nlink;
        }
        ours
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
            None => matches!(locate(&self.fs, path, &Caller::root()), Ok((_, Some(_)))),
        }
    }

    /// Applies `op`; why it failed: through FUSE the errno a process
    /// sees, through the trait the error (whose errno is not compared: the
    /// test reaches the path by its own lookups, not the kernel's).
    fn apply(
        &self,
        op: &Op,
        paths: &[Vec<&str>],
        user: bool,
    ) -> Result<(), (Option<Errno>, String)> {
        match self.mountpoint() {
            Some(m) => as_caller(user, || apply_host(m, op, paths))
                .map_err(|e| (Some(e), format!("errno {e}"))),
            None => apply_stack(&self.fs, op, paths, &caller(user))
                .map_err(|e| (None, format!("{e:?}"))),
        }
    }
}

/// Whether the two trees agree on which paths are one file (hard links)
/// and which are different files: inode numbers differ between overlayfs
/// and layerfs, the relation they draw must not.
fn same_files(theirs: &BTreeMap<String, FileId>, ours: &BTreeMap<String, FileId>) -> bool {
    theirs.keys().eq(ours.keys())
        && theirs.iter().zip(ours).all(|((_, t1), (_, o1))| {
            theirs
                .values()
                .zip(ours.values())
                .all(|(t2, o2)| (t1 == t2) == (o1 == o2))
        })
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

fn run_case(
    layers: &[LayerSpec],
    ops: &[Op],
    user: bool,
    succeeded: &Succeeded,
) -> Result<(), TestCaseError> {
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
    if user {
        // The user reaches the mounts, and owns both uppers' roots (the
        // merged root), as a workspace's owner would.
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for upper in [d("ov-upper"), d("upper")] {
            std::os::unix::fs::chown(&upper, Some(USER), Some(USER)).unwrap();
        }
    }
    let top_first: Vec<_> = ov_lowers.iter().rev().cloned().collect();
    let mount =
        mount(&top_first, &d("ov-upper"), &d("ov-work"), &m).map_err(TestCaseError::fail)?;
    let ours = Ours::open(&oci_lowers, &d("upper"), &d("state"), &d("fuse"), user);
    prop_assert_eq!(
        host_tree(&m),
        ours.tree_beside(&host_tree(&m)),
        "the layers alone differ"
    );
    for (i, op) in ops.iter().enumerate() {
        let before = ours.ids();
        let host = as_caller(user, || apply_host(&m, op, &paths));
        let result = ours.apply(op, &paths, user);
        check_ids(&before, &ours.ids(), result.is_ok().then_some(op), &paths)?;
        prop_assert_eq!(
            host.is_ok(),
            result.is_ok(),
            "op {} {:?}: overlayfs {:?}, layerfs {:?}",
            i,
            op,
            host,
            result
        );
        if let (Err(theirs), Err((Some(ours), _))) = (&host, &result) {
            prop_assert_eq!(theirs, ours, "op {} {:?}: the errno", i, op);
        }
        prop_assert!(
            same_files(&host_ids(&m), &ours.ids()),
            "after op {} {:?}: paths that are one file in one are not in the other",
            i,
            op
        );
        // After every step, so that nothing kept from before it (a name
        // looked up, a listing, attributes) outlives what the step changed.
        prop_assert_eq!(
            host_tree(&m),
            ours.tree_beside(&host_tree(&m)),
            "after op {} {:?}",
            i,
            op
        );
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
        *succeeded.lock().unwrap().entry(kind).or_default() += usize::from(host.is_ok());
    }
    prop_assert_eq!(host_tree(&m), ours.tree_beside(&host_tree(&m)));
    let before = ours.ids();
    drop(ours);
    // Everything again from what was persisted: the same tree, the same ids.
    let ours = Ours::open(&oci_lowers, &d("upper"), &d("state"), &d("fuse"), user);
    prop_assert_eq!(
        host_tree(&m),
        ours.tree_beside(&host_tree(&m)),
        "after a restart"
    );
    prop_assert_eq!(before, ours.ids(), "ids after a restart");
    drop(mount);
    Ok(())
}

#[test]
fn random_operations_match_overlayfs() {
    let cases = std::env::var("LAYERFS_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    differential(false, cases);
}

/// The same as a caller who is not root (uid 1000, whose group owns some
/// of the layers' files), through the trait with that caller, or through
/// FUSE from a thread with that identity.
#[test]
fn random_operations_as_a_user_match_overlayfs() {
    let cases = std::env::var("LAYERFS_DIFF_USER_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    differential(true, cases);
}

fn differential(user: bool, cases: u32) {
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
    let succeeded = Succeeded::default();
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
        let succeeded = succeeded.lock().unwrap();
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
            .run(&strategy, |(layers, ops)| {
                run_case(&layers, &ops, user, &succeeded)
            })
            .unwrap();
        if never_succeeded().is_empty() {
            break;
        }
    }
    eprintln!(
        "operations that succeeded on both, by kind: {:?}",
        succeeded.lock().unwrap()
    );
    let missing = never_succeeded();
    assert!(
        missing.is_empty(),
        "never succeeded in 5 batches of {cases} sequences: {missing:?}"
    );
}
