//! A local user who swaps an entry of the export for a symlink to a file
//! outside it, while a change to that entry is under way, never gets the
//! change applied to the file outside.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use layerfs_vfs::{Caller, Filesystem, LocalFs, SetAttr, SetTime, Timestamp};

#[test]
fn changes_raced_by_a_symlink_swap_never_reach_a_file_outside() {
    let t = tempfile::tempdir().unwrap();
    let export = t.path().join("export");
    let outside = t.path().join("secret");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(&outside, b"not yours").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = std::fs::metadata(&outside).unwrap();
    std::fs::write(export.join("f"), b"in the export").unwrap();
    std::os::unix::fs::symlink(&outside, export.join("link")).unwrap();

    let fs = LocalFs::open(&export).unwrap();
    let id = fs.lookup(&Caller::root(), fs.root(), b"f").unwrap().fileid;
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (export, stop) = (export.clone(), stop.clone());
        std::thread::spawn(move || {
            let dir = rustix::fs::open(
                &export,
                rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            let mut swaps = 0u64;
            while !stop.load(Relaxed) {
                rustix::fs::renameat_with(
                    &dir,
                    "f",
                    &dir,
                    "link",
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let changes = [
        SetAttr {
            mode: Some(0o777),
            ..SetAttr::default()
        },
        SetAttr {
            size: Some(0),
            ..SetAttr::default()
        },
        SetAttr {
            uid: Some(4242),
            gid: Some(4242),
            ..SetAttr::default()
        },
        SetAttr {
            mtime: SetTime::Client(Timestamp { secs: 1, nanos: 0 }),
            atime: SetTime::Client(Timestamp { secs: 1, nanos: 0 }),
            ..SetAttr::default()
        },
    ];
    let started = Instant::now();
    let (mut tries, mut applied) = (0, 0);
    while tries < 20_000 && started.elapsed() < Duration::from_secs(3) {
        // Errors are fine (the entry moved under the call); reaching
        // outside is not.
        let change = &changes[tries % changes.len()];
        applied += usize::from(fs.setattr(&Caller::root(), id, change, None).is_ok());
        tries += 1;
    }
    stop.store(true, Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(
        swaps > 100,
        "the race ran: {swaps} swaps over {tries} changes"
    );
    // Changes that all failed would prove nothing about where they land.
    assert!(
        applied > 0,
        "none of {tries} changes was applied while the name was swapped"
    );
    let after = std::fs::metadata(&outside).unwrap();
    assert_eq!(
        after.permissions().mode() & 0o7777,
        0o600,
        "mode changed outside"
    );
    assert_eq!(after.len(), before.len(), "truncated outside");
    assert_eq!(
        (after.uid(), after.gid()),
        (before.uid(), before.gid()),
        "owner changed outside"
    );
    assert_eq!(after.mtime(), before.mtime(), "times changed outside");
}
