use crate::FileId;

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    BlockDevice,
    CharDevice,
    Fifo,
    Socket,
}

/// Attributes of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub kind: FileKind,
    /// Permission bits, with setuid, setgid and sticky (07777).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Bytes of storage in use.
    pub used: u64,
    /// Major and minor device numbers of a device file.
    pub rdev: (u32, u32),
    pub fileid: FileId,
    /// Tells a file from a later one that reuses its id (its birth time where
    /// the host records one); 0 where unknown.
    pub generation: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

impl Attr {
    /// Attributes with every field zero but the kind: a base to fill in.
    pub fn blank(kind: FileKind) -> Attr {
        Attr {
            kind,
            mode: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            size: 0,
            used: 0,
            rdev: (0, 0),
            fileid: 0,
            generation: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
        }
    }

    /// What a change reports of this object from before it.
    pub fn before_change(&self) -> AttrBefore {
        AttrBefore {
            size: self.size,
            mtime: self.mtime,
            ctime: self.ctime,
        }
    }
}

/// What a change reports of an object from just before it (NFS calls it
/// weak cache consistency data): its size and times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrBefore {
    pub size: u64,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

/// A change to one object: its attributes just before and just after,
/// taken under the same lock as the change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub before: Option<AttrBefore>,
    pub after: Option<Attr>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SetTime {
    #[default]
    Keep,
    ServerNow,
    Client(Timestamp),
}

/// Attributes to set; `None` and `Keep` leave one alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: SetTime,
    pub mtime: SetTime,
}

impl SetAttr {
    pub fn is_empty(&self) -> bool {
        *self == SetAttr::default()
    }
}
