//! The stack's caches hold descriptors; they must stay within the process's
//! limit on open files, however many directories and files are touched.
//! (Its own test binary: it lowers the limit for the whole process.)

use layerfs_layers::StackFs;
use layerfs_vfs::{Caller, Create, Filesystem, SetAttr, Stability};
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

#[test]
fn thousands_of_files_in_many_directories_within_256_descriptors() {
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(256),
            maximum: Some(256),
        },
    )
    .unwrap();
    assert_eq!(getrlimit(Resource::Nofile).current, Some(256));
    let t = tempfile::tempdir().unwrap();
    let lowers: Vec<_> = (0..5)
        .map(|l| {
            let p = t.path().join(format!("l{l}"));
            for d in 0..60 {
                std::fs::create_dir_all(p.join(format!("d{d}"))).unwrap();
                std::fs::write(p.join(format!("d{d}/lower{l}")), b"x").unwrap();
            }
            p
        })
        .collect();
    let fs = StackFs::open_in_upper(&lowers, &t.path().join("upper")).unwrap();
    let who = Caller::root();
    for round in 0..2 {
        for d in 0..60 {
            let dir = fs
                .lookup(&who, fs.root(), format!("d{d}").as_bytes())
                .unwrap()
                .fileid;
            for f in 0..25 {
                let name = format!("f{round}-{f}");
                let how = Create::Unchecked(SetAttr::default());
                let (attr, _) = fs.create(&who, dir, name.as_bytes(), how).unwrap();
                fs.write(&who, attr.fileid, 0, b"data", Stability::Unstable)
                    .unwrap();
            }
            // Lower files too: copied up on their first write.
            let lower = fs
                .lookup(&who, dir, format!("lower{}", d % 5).as_bytes())
                .unwrap();
            fs.write(&who, lower.fileid, 1, b"y", Stability::Unstable)
                .unwrap();
            let page = fs.readdir(&who, dir, 0, 1000, true).unwrap();
            assert!(page.entries.iter().all(|e| e.attr.is_some()));
        }
    }
}
