//! A commit captures one moment: files written behind the filesystem's
//! back (a FUSE passthrough descriptor) go on in the new upper, the layer
//! keeps what they held during the commit and never changes again, and a
//! crash at either side of the stack's record is finished or undone.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerfs_layers::{tree_digest, StackFs, Workspace};
use layerfs_vfs::{Caller, Create, FileId, Filesystem, SetAttr, Stability};

const ROOT: FileId = 1;

fn root() -> Caller {
    Caller::root()
}

fn create(fs: &dyn Filesystem, name: &str, data: &[u8]) -> FileId {
    create_in(fs, ROOT, name, data)
}

fn create_in(fs: &dyn Filesystem, dir: FileId, name: &str, data: &[u8]) -> FileId {
    let (attr, _) = fs
        .create(
            &root(),
            dir,
            name.as_bytes(),
            Create::Unchecked(SetAttr::default()),
        )
        .unwrap();
    fs.write(&root(), attr.fileid, 0, data, Stability::Unstable)
        .unwrap();
    attr.fileid
}

fn read(fs: &dyn Filesystem, id: FileId) -> Vec<u8> {
    let mut out = Vec::new();
    fs.read(&root(), id, 0, 1 << 20, &mut out).unwrap();
    out
}

/// What a passthrough open holds: the host file, opened for writing.
fn writable(fs: &dyn Filesystem, id: FileId) -> Arc<OwnedFd> {
    fs.host_files()
        .expect("a stack has host files")
        .host_file(&root(), id, true)
        .unwrap()
        .expect("a stack hands out its upper files")
}

fn append(fd: &OwnedFd, data: &[u8]) {
    let end = rustix::fs::fstat(fd).unwrap().st_size as u64;
    assert_eq!(rustix::io::pwrite(fd, data, end).unwrap(), data.len());
}

fn lower(t: &Path) -> PathBuf {
    let l = t.join("base");
    std::fs::create_dir(&l).unwrap();
    std::fs::write(l.join("old.txt"), b"lower\n").unwrap();
    l
}

#[test]
fn a_file_written_directly_across_a_commit_leaves_the_layer_as_it_was_at_the_commit() {
    let t = tempfile::tempdir().unwrap();
    let base = lower(t.path());
    let ws = Workspace::create(&t.path().join("ws"), &[base]).unwrap();
    let fs = ws.fs();
    let new = create(&*fs, "new.txt", b"before\n");
    let old = fs.lookup(&root(), ROOT, b"old.txt").unwrap().fileid;
    let held_new = writable(&*fs, new);
    // Opening a lower file for writing copies it up.
    let held_old = writable(&*fs, old);
    append(&held_old, b"before\n");
    // Two names of one file, both moving.
    fs.link(&root(), new, ROOT, b"again.txt").unwrap();

    let layer = ws.commit(&[new, old]).unwrap();
    let digest = tree_digest(&layer).unwrap();
    append(&held_new, b"after\n");
    append(&held_old, b"after\n");

    assert_eq!(std::fs::read(layer.join("new.txt")).unwrap(), b"before\n");
    assert_eq!(
        std::fs::read(layer.join("old.txt")).unwrap(),
        b"lower\nbefore\n"
    );
    let (a, b) = (
        std::fs::metadata(layer.join("new.txt")).unwrap(),
        std::fs::metadata(layer.join("again.txt")).unwrap(),
    );
    assert_eq!(
        (a.ino(), a.nlink()),
        (b.ino(), 2),
        "the layer keeps the link"
    );
    assert_eq!(
        tree_digest(&layer).unwrap(),
        digest,
        "the layer never changes"
    );
    // The workspace shows every write, under the same ids.
    assert_eq!(fs.lookup(&root(), ROOT, b"new.txt").unwrap().fileid, new);
    assert_eq!(fs.lookup(&root(), ROOT, b"again.txt").unwrap().fileid, new);
    assert_eq!(fs.lookup(&root(), ROOT, b"old.txt").unwrap().fileid, old);
    assert_eq!(read(&*fs, new), b"before\nafter\n");
    assert_eq!(read(&*fs, old), b"lower\nbefore\nafter\n");

    // A second commit holds the later writes; the first layer is unchanged.
    drop((held_new, held_old));
    let second = ws.commit(&[]).unwrap();
    assert_eq!(
        std::fs::read(second.join("new.txt")).unwrap(),
        b"before\nafter\n"
    );
    assert_eq!(tree_digest(&layer).unwrap(), digest);

    // And all of it after a restart.
    drop(fs);
    drop(ws);
    let ws = Workspace::open(&t.path().join("ws")).unwrap();
    let fs = ws.fs();
    assert_eq!(
        read(&*fs, fs.lookup(&root(), ROOT, b"new.txt").unwrap().fileid),
        b"before\nafter\n"
    );
    assert_eq!(tree_digest(&layer).unwrap(), digest);
}

#[test]
fn a_file_the_nfs_client_keeps_for_an_open_removed_file_is_left_out_of_the_layer() {
    let t = tempfile::tempdir().unwrap();
    let base = lower(t.path());
    let ws = Workspace::create(&t.path().join("ws"), &[base]).unwrap();
    let fs = ws.fs();
    let debris = ".nfs00000000000012340000000a";
    let id = create(&*fs, debris, b"still open\n");
    create(&*fs, "kept.txt", b"kept\n");
    let layer = ws.commit(&[]).unwrap();
    assert!(!layer.join(debris).exists(), "not in the layer");
    assert!(layer.join("kept.txt").exists());
    // The client still reaches it by its handle, and removes it at the close.
    assert_eq!(read(&*fs, id), b"still open\n");
    fs.remove(&root(), ROOT, debris.as_bytes()).unwrap();
    let second = ws.commit(&[]).unwrap();
    assert!(!second.join(debris).exists() && !second.join(format!(".wh.{debris}")).exists());
}

/// The stack over `lowers` and `upper`, its state in `state`.
fn open(lowers: &[PathBuf], upper: &Path, state: &Path) -> StackFs {
    StackFs::open(lowers, upper, state).unwrap()
}

/// A commit of `written` that dies (a panic, as a crash would) in its
/// `persist` step, after recording the new stack or before.
fn commit_cut_short(
    fs: &StackFs,
    new_upper: &Path,
    written: &[FileId],
    recorded: &Path,
    after: bool,
) {
    let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fs.commit_upper(new_upper, written, |stack| {
            if after {
                let lines: Vec<_> = stack.iter().map(|p| p.display().to_string()).collect();
                std::fs::write(recorded, lines.join("\n")).unwrap();
            }
            panic!("the daemon dies here");
        })
    }));
    assert!(cut.is_err());
}

#[test]
fn a_commit_cut_short_after_its_stack_was_recorded_is_finished_at_the_next_open() {
    let t = tempfile::tempdir().unwrap();
    let base = lower(t.path());
    let (upper, next, state) = (
        t.path().join("u1"),
        t.path().join("u2"),
        t.path().join("state"),
    );
    let fs = open(std::slice::from_ref(&base), &upper, &state);
    let id = create(&fs, "f", b"at the commit\n");
    let held = writable(&fs, id);
    commit_cut_short(&fs, &next, &[id], &t.path().join("stack"), true);
    drop(fs);
    // The layer shares the file with the new upper until the next open.
    let ino = |p: PathBuf| std::fs::metadata(p).unwrap().ino();
    assert_eq!(ino(upper.join("f")), ino(next.join("f")));
    assert!(state.join("commit.journal").exists());

    let fs = open(&[base, upper.clone()], &next, &state);
    assert_ne!(
        ino(upper.join("f")),
        ino(next.join("f")),
        "the layer has its copy"
    );
    assert!(!state.join("commit.journal").exists());
    append(&held, b"later\n");
    assert_eq!(std::fs::read(upper.join("f")).unwrap(), b"at the commit\n");
    assert_eq!(
        read(&fs, fs.lookup(&root(), ROOT, b"f").unwrap().fileid),
        b"at the commit\nlater\n"
    );
    assert_eq!(
        fs.lookup(&root(), ROOT, b"f").unwrap().fileid,
        id,
        "same id"
    );
}

#[test]
fn a_commit_cut_short_before_its_stack_was_recorded_leaves_the_old_stack_whole() {
    let t = tempfile::tempdir().unwrap();
    let base = lower(t.path());
    let (upper, next, state) = (
        t.path().join("u1"),
        t.path().join("u2"),
        t.path().join("state"),
    );
    let fs = open(std::slice::from_ref(&base), &upper, &state);
    let id = create(&fs, "f", b"data\n");
    let held = writable(&fs, id);
    commit_cut_short(&fs, &next, &[id], &t.path().join("stack"), false);
    drop(fs);
    append(&held, b"more\n");
    let fs = open(&[base], &upper, &state);
    assert!(
        !state.join("commit.journal").exists(),
        "dropped at the open"
    );
    assert_eq!(
        read(&fs, fs.lookup(&root(), ROOT, b"f").unwrap().fileid),
        b"data\nmore\n"
    );
}

#[test]
fn a_commit_whose_stack_cannot_be_recorded_takes_everything_back() {
    let t = tempfile::tempdir().unwrap();
    let base = lower(t.path());
    let (upper, next, state) = (
        t.path().join("u1"),
        t.path().join("u2"),
        t.path().join("state"),
    );
    let fs = open(&[base], &upper, &state);
    let id = create(&fs, "f", b"data\n");
    let held = writable(&fs, id);
    let refused = fs.commit_upper(&next, &[id], |_| Err(layerfs_vfs::Error::NoSpc));
    assert_eq!(refused.unwrap_err(), layerfs_vfs::Error::NoSpc);
    assert!(!next.exists(), "the new upper is taken back");
    assert!(!state.join("commit.journal").exists());
    assert!(
        std::fs::read_dir(state.join("work"))
            .unwrap()
            .next()
            .is_none(),
        "no copies left"
    );
    append(&held, b"more\n");
    assert_eq!(read(&fs, id), b"data\nmore\n");
    assert_eq!(fs.stack().len(), 2, "the old stack");
}

/// A commit by a server that is not root, of a file the NFS client keeps
/// in a directory made read-only since: the new upper's copy of that
/// directory and the committed layer's are read-only too, and the file's
/// second name goes into one and its debris out of the other all the same.
#[cfg(target_os = "linux")]
#[test]
fn a_server_that_is_not_root_commits_debris_in_a_read_only_directory() {
    use std::os::unix::fs::PermissionsExt;
    const USER: u32 = 1000;
    const TEST: &str = "a_server_that_is_not_root_commits_debris_in_a_read_only_directory";
    if !rustix::process::geteuid().is_root() {
        return layerfs_testkit::skip_or_fail(TEST, "needs root, to act as a user");
    }
    let t = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(t.path(), Some(USER), Some(USER)).unwrap();
    let dir = t.path().to_path_buf();
    let layer = std::thread::spawn(move || {
        // This thread alone becomes the user.
        let (uid, gid) = (
            rustix::fs::Uid::from_raw(USER),
            rustix::fs::Gid::from_raw(USER),
        );
        rustix::thread::set_thread_res_gid(gid, gid, gid).unwrap();
        rustix::thread::set_thread_res_uid(uid, uid, uid).unwrap();
        let base = lower(&dir);
        std::fs::create_dir(base.join("ro")).unwrap();
        let ws = Workspace::create(&dir.join("ws"), &[base]).unwrap();
        let fs = ws.fs();
        let ro = fs.lookup(&root(), ROOT, b"ro").unwrap().fileid;
        let debris = ".nfs00000000000012340000000b";
        let held = create_in(&*fs, ro, debris, b"still open\n");
        let mode = |mode| SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        fs.setattr(&root(), ro, &mode(0o555), None).unwrap();
        let layer = ws.commit(&[]).unwrap();
        assert_eq!(
            read(&*fs, held),
            b"still open\n",
            "the client's file is kept"
        );
        layer
    })
    .join()
    .unwrap();
    assert!(!layer
        .join("ro")
        .join(".nfs00000000000012340000000b")
        .exists());
    let mode = std::fs::metadata(layer.join("ro"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o555, "the layer's directory keeps its mode");
}
