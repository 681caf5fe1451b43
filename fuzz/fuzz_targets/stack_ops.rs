//! Random sequences of operations on a `StackFs` (a lower layer under an
//! upper), checking after each one what must always hold: every name a
//! directory lists resolves by lookup to the id it was listed with, and
//! that id's attributes say the same kind; and nothing panics.
#![no_main]

use std::sync::Arc;

use layerfs_layers::StackFs;
use layerfs_vfs::{Caller, Create, FileId, FileKind, Filesystem, SetAttr, Stability};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Create {
        dir: u8,
        name: u8,
    },
    Mkdir {
        dir: u8,
        name: u8,
    },
    Symlink {
        dir: u8,
        name: u8,
    },
    Write {
        file: u8,
        offset: u16,
        len: u8,
    },
    Truncate {
        file: u8,
        size: u16,
    },
    Chmod {
        file: u8,
        mode: u16,
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
        file: u8,
        dir: u8,
        name: u8,
    },
}

const NAMES: [&[u8]; 6] = [b"a", b"b", b"etc", b"f", b"sub", b".wh.x"];

fn name(n: u8) -> &'static [u8] {
    NAMES[n as usize % NAMES.len()]
}

/// Directories and files seen so far, by id.
struct Known {
    dirs: Vec<FileId>,
    files: Vec<FileId>,
}

impl Known {
    fn dir(&self, n: u8) -> FileId {
        self.dirs[n as usize % self.dirs.len()]
    }
    fn file(&self, n: u8) -> Option<FileId> {
        (!self.files.is_empty()).then(|| self.files[n as usize % self.files.len()])
    }
}

fn apply(fs: &StackFs, who: &Caller, known: &mut Known, op: &Op) {
    let new = |attr: layerfs_vfs::Result<layerfs_vfs::Attr>, known: &mut Known| {
        if let Ok(a) = attr {
            match a.kind {
                FileKind::Directory => known.dirs.push(a.fileid),
                _ => known.files.push(a.fileid),
            }
        }
    };
    match *op {
        Op::Create { dir, name: n } => {
            let made = fs.create(
                who,
                known.dir(dir),
                name(n),
                Create::Guarded(SetAttr::default()),
            );
            new(made.map(|(a, _)| a), known);
        }
        Op::Mkdir { dir, name: n } => {
            let made = fs.mkdir(who, known.dir(dir), name(n), &SetAttr::default());
            new(made.map(|(a, _)| a), known);
        }
        Op::Symlink { dir, name: n } => {
            let made = fs.symlink(who, known.dir(dir), name(n), b"../a", &SetAttr::default());
            new(made.map(|(a, _)| a), known);
        }
        Op::Write { file, offset, len } => {
            if let Some(id) = known.file(file) {
                let data = vec![len; len as usize];
                let _ = fs.write(who, id, u64::from(offset), &data, Stability::FileSync);
            }
        }
        Op::Truncate { file, size } => {
            if let Some(id) = known.file(file) {
                let set = SetAttr {
                    size: Some(u64::from(size)),
                    ..SetAttr::default()
                };
                let _ = fs.setattr(who, id, &set, None);
            }
        }
        Op::Chmod { file, mode } => {
            if let Some(id) = known.file(file) {
                let set = SetAttr {
                    mode: Some(u32::from(mode) & 0o7777),
                    ..SetAttr::default()
                };
                let _ = fs.setattr(who, id, &set, None);
            }
        }
        Op::Remove { dir, name: n } => {
            let _ = fs.remove(who, known.dir(dir), name(n));
        }
        Op::Rmdir { dir, name: n } => {
            let _ = fs.rmdir(who, known.dir(dir), name(n));
        }
        Op::Rename {
            from,
            name: n,
            to,
            new_name,
        } => {
            let _ = fs.rename(who, known.dir(from), name(n), known.dir(to), name(new_name));
        }
        Op::Link { file, dir, name: n } => {
            if let Some(id) = known.file(file) {
                let _ = fs.link(who, id, known.dir(dir), name(n));
            }
        }
    }
}

/// Every listed name of every directory still there resolves to the id
/// and kind it was listed with.
fn check(fs: &StackFs, who: &Caller, known: &Known) {
    for &dir in &known.dirs {
        let Ok(page) = fs.readdir(who, dir, 0, 1 << 16, false) else {
            continue; // removed, or renamed away and gone
        };
        for entry in page.entries {
            if entry.name[..] == b"."[..] || entry.name[..] == b".."[..] {
                continue;
            }
            let found = fs.lookup(who, dir, &entry.name).unwrap_or_else(|e| {
                panic!(
                    "{:?} listed in {dir} but lookup says {e:?}",
                    String::from_utf8_lossy(&entry.name)
                )
            });
            assert_eq!(
                found.fileid,
                entry.fileid,
                "{:?}: listed id",
                String::from_utf8_lossy(&entry.name)
            );
            let attr = fs
                .getattr(found.fileid)
                .expect("a listed file has attributes");
            assert_eq!(attr.kind, found.kind);
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let dir = tempfile::tempdir().unwrap();
    let lower = dir.path().join("lower");
    std::fs::create_dir_all(lower.join("etc/sub")).unwrap();
    std::fs::write(lower.join("a"), b"lower a").unwrap();
    std::fs::write(lower.join("etc/f"), b"lower f").unwrap();
    std::fs::hard_link(lower.join("a"), lower.join("etc/a")).unwrap();
    std::fs::write(lower.join("etc/.wh.b"), b"").unwrap();
    let fs = Arc::new(
        StackFs::open(
            &[lower],
            &dir.path().join("upper"),
            &dir.path().join("state"),
        )
        .unwrap(),
    );
    let who = Caller::root();
    let root = fs.root();
    let etc = fs.lookup(&who, root, b"etc").unwrap().fileid;
    let mut known = Known {
        dirs: vec![root, etc],
        files: vec![fs.lookup(&who, root, b"a").unwrap().fileid],
    };
    for op in ops.iter().take(64) {
        apply(&fs, &who, &mut known, op);
        check(&fs, &who, &known);
    }
});
