//! The control protocol: one JSON object per line each way, a request and
//! then its reply, at most [`MAX_MESSAGE`] bytes. A long request (an import,
//! a commit) may send [`Progress`] lines before its reply.

use std::io::{self, BufRead, Read, Write};
use std::path::PathBuf;

use layerfs_rpc::TransportStats;
use serde::{Deserialize, Serialize};

use crate::catalog::{Door, MountRecord};

/// The largest request line: far above any request (names and paths), and
/// it bounds what a client can make the daemon hold.
pub const MAX_MESSAGE: usize = 1024 * 1024;

/// The largest reply line a command reads: a diff of a million paths fits.
/// The daemon is the user's own; this only bounds a broken one.
pub const MAX_REPLY: usize = 256 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    LayerImport {
        source: PathBuf,
    },
    LayerLs,
    LayerRm {
        id: String,
    },
    /// Hashes each layer's files again (or one layer's: an id or its first
    /// 4+ characters) and compares the digest with its id.
    LayerCheck {
        #[serde(default)]
        id: Option<String>,
    },
    Create {
        name: String,
        /// Workspaces, layers, or image references (pulled if missing).
        from: Vec<String>,
        /// What its upper may hold, in bytes.
        #[serde(default)]
        size: Option<u64>,
        /// How to pull an image of `from` the store lacks.
        #[serde(default)]
        registry: RegistryOptions,
        /// Where to mount it once made, in the same request.
        #[serde(default)]
        mount: Option<PathBuf>,
        /// Through which door (the platform's default if none).
        #[serde(default)]
        door: Option<Door>,
    },
    /// Sets (or with `None` lifts) the size limit of a workspace.
    SetSize {
        name: String,
        size: Option<u64>,
    },
    Mount {
        name: String,
        path: PathBuf,
        door: Option<Door>,
    },
    Unmount {
        target: String,
    },
    Commit {
        name: String,
        message: Option<String>,
    },
    Ls,
    Rm {
        name: String,
        force: bool,
    },
    Stats,
    Diff {
        name: String,
    },
    /// Paths from the workspace's root; none for all of it.
    Reset {
        name: String,
        paths: Vec<String>,
    },
    /// Pulls an image from its registry into the store.
    Pull {
        reference: String,
        #[serde(default)]
        registry: RegistryOptions,
    },
    /// Pushes layers (or a workspace's layers) as an image.
    Push {
        /// Workspaces (committed, no changes of their own) and layers,
        /// bottom first.
        sources: Vec<String>,
        reference: String,
        #[serde(default)]
        registry: RegistryOptions,
        /// How layers not in the registry yet are written: `gzip` (the
        /// default) or `estargz` (pulled lazily).
        #[serde(default)]
        format: Option<String>,
    },
    ImageLs,
    ImageRm {
        reference: String,
    },
    /// Stop serving, leaving every mount as it is, for a daemon that takes
    /// over (`layerfs daemon --upgrade`); answered with this daemon's pid.
    HandOver,
    /// What the store's parts take on disk, and what pruning would free.
    SystemDf,
    /// Removes every layer no workspace stacks on and no image lists.
    LayerPrune,
    /// Forgets every image no workspace is made from (none whose layers
    /// begin a workspace's), then removes the layers only they listed.
    ImagePrune,
}

/// How to pull from a registry (`layerfs pull`, `create --from REF`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RegistryOptions {
    /// `os/arch[/variant]`; the host's when absent.
    #[serde(default)]
    pub platform: Option<String>,
    /// Registries reached over plain HTTP.
    #[serde(default)]
    pub insecure: Vec<String>,
    /// Accept any certificate.
    #[serde(default)]
    pub no_tls_verify: bool,
    /// Download every layer whole, even one with a table of contents.
    #[serde(default)]
    pub whole: bool,
    /// Wait until every lazy layer of the image is complete.
    #[serde(default)]
    pub complete: bool,
    /// Lazy layers get their data only when read: no completion.
    #[serde(default)]
    pub on_read: bool,
}

/// What a push did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PushInfo {
    pub reference: String,
    /// The digest of the manifest pushed.
    pub digest: String,
    pub layers: usize,
    /// Of its layers, how many were uploaded (the registry had the rest).
    pub uploaded: usize,
}

/// An image in the store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageInfo {
    pub reference: String,
    /// The digest of its manifest.
    pub digest: String,
    /// Its layers' ids, bottom first.
    pub layers: Vec<String>,
    /// Its blobs' bytes in the registry.
    pub size: u64,
    pub created: u64,
    /// Of its layers, how many this pull downloaded (the rest were here).
    #[serde(default)]
    pub fetched: usize,
    /// Where layers are lazy: the bytes of their files' data here, and in all.
    #[serde(default)]
    pub local: Option<(u64, u64)>,
    /// The blobs this pull downloaded whole, having no table of contents to
    /// pull them lazily.
    #[serde(default)]
    pub whole: Vec<String>,
}

/// What the daemon answers a request: its [`Response`], or why not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ok(Response),
    Error(ControlError),
}

impl From<Result<Response, ControlError>> for Reply {
    fn from(outcome: Result<Response, ControlError>) -> Reply {
        match outcome {
            Ok(response) => Reply::Ok(response),
            Err(e) => Reply::Error(e),
        }
    }
}

impl From<Reply> for Result<Response, ControlError> {
    fn from(reply: Reply) -> Self {
        match reply {
            Reply::Ok(response) => Ok(response),
            Reply::Error(e) => Err(e),
        }
    }
}

/// What a request gives back, one variant per kind of answer; `--json`
/// prints its `data`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum Response {
    /// A layer imported or committed.
    Layer(LayerInfo),
    Layers(Vec<LayerInfo>),
    /// A workspace created, mounted, unmounted or limited.
    Workspace(WorkspaceInfo),
    Workspaces(Vec<WorkspaceInfo>),
    /// The name or id of what a removal took away.
    Removed(String),
    Diff(Vec<DiffEntry>),
    /// How many names a reset changed.
    Reset(usize),
    Stats(Stats),
    /// An image pulled.
    Image(ImageInfo),
    Images(Vec<ImageInfo>),
    Pushed(PushInfo),
    /// The pid of a daemon handing over: gone once it has.
    HandingOver(u32),
    Space(Space),
    Pruned(Pruned),
    Checked(Vec<LayerCheck>),
}

/// What `layer check` found of one layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerCheck {
    pub id: String,
    pub found: Found,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Found {
    /// Its files hash to its id.
    Sound,
    /// A lazy layer whose data is still coming: each piece is checked
    /// against its digest as it comes, the whole once it is complete.
    Filling { here: u64, total: u64 },
    /// Its files hash to another digest: changed since it was made.
    Differs { digest: String },
    /// Its files cannot be read.
    Unreadable { why: String },
}

/// What the store's parts take on disk (each file counted once, where it
/// is first found: layers, then workspaces), and what pruning would free.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Space {
    pub layers: SpaceOf,
    pub images: SpaceOf,
    /// Workspaces: their changes and the copies of layers they keep.
    pub workspaces: SpaceOf,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpaceOf {
    pub count: usize,
    /// Bytes on disk.
    pub bytes: u64,
    /// How many a prune would remove, and the bytes it would free.
    pub reclaimable: usize,
    pub reclaimable_bytes: u64,
}

/// What a prune removed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Pruned {
    pub images: Vec<String>,
    pub layers: Vec<String>,
    /// Bytes freed on disk.
    pub bytes: u64,
}

/// A value one variant of [`Response`] carries: what a caller expects of
/// a request, and takes out of its reply.
pub trait Answer: Sized {
    fn from_response(response: Response) -> Option<Self>;
}

macro_rules! answers {
    ($($variant:ident => $t:ty),* $(,)?) => {$(
        impl Answer for $t {
            fn from_response(response: Response) -> Option<Self> {
                match response {
                    Response::$variant(value) => Some(value),
                    _ => None,
                }
            }
        }
    )*};
}

answers! {
    Layer => LayerInfo,
    Layers => Vec<LayerInfo>,
    Workspace => WorkspaceInfo,
    Workspaces => Vec<WorkspaceInfo>,
    Removed => String,
    Diff => Vec<DiffEntry>,
    Reset => usize,
    Stats => Stats,
    Image => ImageInfo,
    Images => Vec<ImageInfo>,
    Pushed => PushInfo,
    HandingOver => u32,
    Space => Space,
    Checked => Vec<LayerCheck>,
    Pruned => Pruned,
}

/// Why a request was refused or failed: a kind a program can match on,
/// and a one-line message for the user.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlError {
    pub kind: ErrorKind,
    pub message: String,
}

/// The kinds of [`ControlError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request could not be read.
    BadRequest,
    /// An argument is malformed: a name, a path, a size, a reference.
    Invalid,
    /// No workspace, layer or image of that name.
    NotFound,
    /// The name is taken.
    Exists,
    /// What it names is in use: mounted, under a workspace or an image,
    /// or (to push) holding changes not committed.
    InUse,
    /// Too many clients at once: try again.
    Busy,
    /// Not allowed to this user (another uid, a device as non-root).
    Denied,
    /// The registry wants credentials: `layerfs login`.
    Unauthorized,
    /// The registry failed, refused, or sent what does not verify.
    Registry,
    /// The store's filesystem, or a workspace's size limit, is full.
    NoSpace,
    /// The store, the host or a mount failed.
    Failed,
}

impl ControlError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ControlError {
        ControlError {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ControlError {}

/// A host or store failure, with the kind its errno says.
impl From<std::io::Error> for ControlError {
    fn from(e: std::io::Error) -> ControlError {
        use std::io::ErrorKind as Io;
        let kind = match e.kind() {
            Io::StorageFull | Io::QuotaExceeded => ErrorKind::NoSpace,
            Io::PermissionDenied => ErrorKind::Denied,
            _ => ErrorKind::Failed,
        };
        ControlError::new(kind, e.to_string())
    }
}

/// A filesystem's failure, with the kind its error says.
impl From<layerfs_vfs::Error> for ControlError {
    fn from(e: layerfs_vfs::Error) -> ControlError {
        use layerfs_vfs::Error as Fs;
        let kind = match e {
            Fs::NoSpc | Fs::DQuot => ErrorKind::NoSpace,
            Fs::Perm | Fs::Access => ErrorKind::Denied,
            _ => ErrorKind::Failed,
        };
        ControlError::new(kind, e.to_string())
    }
}

/// How far a long request has got: bytes done of bytes in all, and for a
/// pull, of each layer it downloads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<PartProgress>,
}

/// How far one part of a request (a layer of a pull) has got.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartProgress {
    pub name: String,
    pub done: u64,
    pub total: u64,
}

impl Progress {
    /// Bytes done of bytes in all, in one part.
    pub fn of(done: u64, total: u64) -> Progress {
        Progress {
            done,
            total,
            parts: Vec::new(),
        }
    }
}

/// What the daemon sends: progress, or the reply that ends the request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Message {
    Progress { progress: Progress },
    Reply(Reply),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerInfo {
    pub id: String,
    pub message: Option<String>,
    /// The workspace whose commit made it.
    pub workspace: Option<String>,
    pub created: u64,
    /// Workspaces stacked on it.
    pub used_by: Vec<String>,
}

/// One path a workspace changed over its layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiffEntry {
    /// `A` added, `C` changed, `D` deleted.
    pub kind: String,
    /// From the workspace's root; bytes that are not UTF-8 shown as U+FFFD.
    pub path: String,
    /// For `C`: what differs (`type`, `data`, `mode`, `owner`, `times`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceInfo {
    pub name: String,
    pub layers: Vec<String>,
    pub parent: Option<String>,
    pub created: u64,
    pub mount: Option<MountRecord>,
    /// `mounted`, `unmounted`, or what went wrong with its mount.
    pub state: String,
    /// What its upper may hold, in bytes, if limited.
    #[serde(default)]
    pub size_limit: Option<u64>,
    /// What its upper holds, in bytes, where it is open (mounted).
    #[serde(default)]
    pub size_used: Option<u64>,
    /// Where its layers are lazy: the bytes of their files' data here, and
    /// in all.
    #[serde(default)]
    pub local: Option<(u64, u64)>,
    /// The blobs the pull this request made downloaded whole, having no
    /// table of contents to pull them lazily.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub whole: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Where the NFS server listens.
    pub nfs: String,
    /// Its counters, as fields of this answer.
    #[serde(flatten)]
    pub transport: TransportStats,
    /// Every procedure called.
    pub procedures: Vec<ProcedureFigures>,
}

/// Calls to one procedure and how long they ran, to within a factor of two.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcedureFigures {
    /// `NFS` or `MOUNT`.
    pub program: String,
    pub procedure: String,
    pub calls: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// Reads one message of at most `limit` bytes ([`MAX_MESSAGE`] for a
/// request, [`MAX_REPLY`] for a reply): `None` at a clean end of stream; an
/// error for a longer line (the rest of the stream is not read) or a stream
/// that ends inside a line.
pub fn read_message(input: &mut impl BufRead, limit: usize) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let read = input
        .by_ref()
        .take(limit as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        let why = if line.len() > limit {
            format!("a message longer than {limit} bytes")
        } else {
            "a message cut short".to_string()
        };
        return Err(io::Error::new(io::ErrorKind::InvalidData, why));
    }
    line.pop();
    Ok(Some(line))
}

pub fn write_message(output: &mut impl Write, message: &impl Serialize) -> io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(io::Error::other)?;
    line.push(b'\n');
    output.write_all(&line)?;
    output.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_carry_the_transport_counters_as_fields_of_their_own() {
        let stats = Stats {
            nfs: "127.0.0.1:2049".into(),
            transport: TransportStats {
                connections: 1,
                records: 2,
                socket_reads: 3,
                replies: 4,
                socket_writes: 5,
                bytes_in: 6,
                bytes_out: 7,
            },
            procedures: Vec::new(),
        };
        let json: serde_json::Value = serde_json::to_value(&stats).unwrap();
        // The fields a client of an earlier daemon reads, by name.
        let names = [
            "connections",
            "records",
            "socket_reads",
            "replies",
            "socket_writes",
            "bytes_in",
            "bytes_out",
        ];
        for (n, name) in names.into_iter().enumerate() {
            assert_eq!(json[name], n as u64 + 1, "{name}");
        }
        assert_eq!(serde_json::from_value::<Stats>(json).unwrap(), stats);
    }

    #[test]
    fn messages_are_lines_within_the_cap() {
        let mut input = &b"{\"op\":\"ls\"}\nrest"[..];
        let first = read_message(&mut input, MAX_MESSAGE).unwrap().unwrap();
        assert_eq!(
            serde_json::from_slice::<Request>(&first).unwrap(),
            Request::Ls
        );
        let cut = read_message(&mut input, MAX_MESSAGE).unwrap_err();
        assert!(cut.to_string().contains("cut short"), "{cut}");
        assert_eq!(read_message(&mut &b""[..], MAX_MESSAGE).unwrap(), None);

        let long = vec![b'x'; MAX_MESSAGE + 10];
        let e = read_message(&mut &long[..], MAX_MESSAGE).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
        let mut exact = vec![b'x'; MAX_MESSAGE];
        exact.push(b'\n');
        assert_eq!(
            read_message(&mut &exact[..], MAX_MESSAGE)
                .unwrap()
                .unwrap()
                .len(),
            MAX_MESSAGE
        );
    }

    #[test]
    fn requests_round_trip() {
        let request = Request::Mount {
            name: "w".into(),
            path: "/mnt/w".into(),
            door: Some(Door::Fuse),
        };
        let mut out = Vec::new();
        write_message(&mut out, &request).unwrap();
        let line = read_message(&mut &out[..], MAX_MESSAGE).unwrap().unwrap();
        assert_eq!(serde_json::from_slice::<Request>(&line).unwrap(), request);
    }
}
