//! What the door's unit tests share: a door over a directory, and an
//! answer that keeps what the door answered, for requests fed to it
//! without a kernel.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use crate::types::{FileAttr, FileType};

use super::*;
use crate::answer::Answer;

pub(super) const ROOT: INodeNo = INodeNo(1);

/// The test's own process as the caller (root where the tests run as root).
pub(super) fn me() -> Who {
    Who {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
        pid: std::process::id(),
    }
}

/// A door over `dir`, without passthrough.
pub(super) fn door(dir: &Path, caching: Caching) -> Door {
    let fs = layerfs_vfs::LocalFs::open(dir).unwrap();
    Door::new(Arc::new(fs), caching)
}

/// What the door answered.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Got {
    Error(Errno),
    Entry(FileAttr),
    Attr(FileAttr),
    Ok,
    Data(Vec<u8>),
    Written(u32),
    Size(u32),
    Opened(FileHandle),
    Created(FileAttr, FileHandle),
    /// A listing: inode, cookie, type and name of each entry.
    Listed(Vec<(INodeNo, u64, FileType, Vec<u8>)>),
    /// A listing with attributes: cookie, name and attributes of each.
    ListedPlus(Vec<(u64, Vec<u8>, FileAttr)>),
    Statfs(Statfs),
}

/// An answer to one request, kept where [`ask`] reads it. A listing takes
/// at most `room` entries.
pub(super) struct Keep {
    got: Rc<RefCell<Option<Got>>>,
    room: usize,
    listed: Vec<(INodeNo, u64, FileType, Vec<u8>)>,
    listed_plus: Vec<(u64, Vec<u8>, FileAttr)>,
}

impl Keep {
    fn put(self, got: Got) {
        *self.got.borrow_mut() = Some(got);
    }
}

/// Feeds one request to the door (`request` answers the [`Keep`] it is
/// given) and returns the answer.
pub(super) fn ask(request: impl FnOnce(Keep)) -> Got {
    ask_with_room(usize::MAX, request)
}

/// [`ask`], for a listing whose reply holds `room` entries.
pub(super) fn ask_with_room(room: usize, request: impl FnOnce(Keep)) -> Got {
    let got = Rc::new(RefCell::new(None));
    request(Keep {
        got: got.clone(),
        room,
        listed: Vec::new(),
        listed_plus: Vec::new(),
    });
    let answered = got.borrow_mut().take();
    answered.expect("the door answered nothing")
}

impl Answer for Keep {
    fn error(self, e: Errno) {
        self.put(Got::Error(e))
    }
}

impl EntryAnswer for Keep {
    fn entry(self, _: &Duration, attr: &FileAttr, _: Generation) {
        self.put(Got::Entry(*attr))
    }
}

impl AttrAnswer for Keep {
    fn attr(self, _: &Duration, attr: &FileAttr) {
        self.put(Got::Attr(*attr))
    }
}

impl EmptyAnswer for Keep {
    fn ok(self) {
        self.put(Got::Ok)
    }
}

impl DataAnswer for Keep {
    fn data(self, data: &[u8]) {
        self.put(Got::Data(data.to_vec()))
    }
}

impl WriteAnswer for Keep {
    fn written(self, size: u32) {
        self.put(Got::Written(size))
    }
}

impl XattrAnswer for Keep {
    fn size(self, size: u32) {
        self.put(Got::Size(size))
    }

    fn data(self, data: &[u8]) {
        self.put(Got::Data(data.to_vec()))
    }
}

impl OpenAnswer for Keep {
    fn opened_as(self, fh: FileHandle, _: FopenFlags, _: Option<&Backing>) {
        self.put(Got::Opened(fh))
    }
}

impl CreateAnswer for Keep {
    fn created_as(
        self,
        _: &Duration,
        attr: &FileAttr,
        _: Generation,
        fh: FileHandle,
        _: FopenFlags,
        _: Option<&Backing>,
    ) {
        self.put(Got::Created(*attr, fh))
    }
}

impl ListingAnswer for Keep {
    fn add(&mut self, ino: INodeNo, cookie: u64, kind: FileType, name: &[u8]) -> bool {
        if self.listed.len() == self.room {
            return true;
        }
        self.listed.push((ino, cookie, kind, name.to_vec()));
        false
    }

    fn ok(mut self) {
        let listed = std::mem::take(&mut self.listed);
        self.put(Got::Listed(listed))
    }
}

impl ListingPlusAnswer for Keep {
    fn add(
        &mut self,
        cookie: u64,
        name: &[u8],
        _: &Duration,
        attr: &FileAttr,
        _: Generation,
    ) -> bool {
        if self.listed_plus.len() == self.room {
            return true;
        }
        self.listed_plus.push((cookie, name.to_vec(), *attr));
        false
    }

    fn ok(mut self) {
        let listed = std::mem::take(&mut self.listed_plus);
        self.put(Got::ListedPlus(listed))
    }
}

impl StatfsAnswer for Keep {
    fn statfs(self, figures: Statfs) {
        self.put(Got::Statfs(figures))
    }
}

/// The attributes of an entry the door answered; panics on anything else.
pub(super) fn entry(got: Got) -> FileAttr {
    match got {
        Got::Entry(attr) | Got::Attr(attr) | Got::Created(attr, _) => attr,
        other => panic!("not an entry: {other:?}"),
    }
}
