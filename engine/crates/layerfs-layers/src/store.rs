//! The store: `<root>/layers/<id>/` for each layer, `<root>/staging/` for
//! imports under way.
//!
//! An import is built in a staging directory (by [`writer`], from a
//! directory or a tar stream), named by its digest, and moved into `layers/`
//! with one rename, after one sync of the staging filesystem and then the
//! rename are made durable. A crash leaves either no layer or a whole one;
//! whatever is left in staging is removed the next time the store opens.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use layerfs_vfs::hostdir;

use crate::digest::tree_digest_with;
use crate::lazy::{Attached, LazyLayer};
use crate::stack::UNSTABLE_INODES;
use crate::StackFs;

mod from_dir;
mod from_tar;
mod from_toc;
mod sparse;
mod writer;

use writer::LayerWriter;

/// A layer's name: the hex digest of its contents.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LayerId(String);

impl LayerId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for LayerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub struct Store {
    root: PathBuf,
    /// The lazy layers attached: this store's alone.
    lazy: Arc<Attached>,
}

static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

impl Store {
    /// Opens (creating if needed) the store at `root`, clearing imports a
    /// crash left unfinished. A store on a filesystem that does not keep
    /// inode numbers is refused before anything is made: no workspace over
    /// its layers could be served (see [`crate::StackFs::open`]).
    pub fn open(root: &Path) -> io::Result<Store> {
        let existing = root
            .ancestors()
            .find(|dir| dir.is_dir())
            .unwrap_or(Path::new("."));
        if !hostdir::keeps_inode_numbers(File::open(existing)?.as_fd()) {
            return Err(io::Error::other(UNSTABLE_INODES));
        }
        fs::create_dir_all(root.join("layers"))?;
        fs::create_dir_all(root.join("lazy"))?;
        // A lazy layer's state is made before its layer is moved into
        // place: state without a layer is an import a crash cut short.
        for entry in fs::read_dir(root.join("lazy"))? {
            let entry = entry?;
            if !root.join("layers").join(entry.file_name()).is_dir() {
                remove_tree(&entry.path())?;
            }
        }
        let staging = root.join("staging");
        if staging.exists() {
            fs::remove_dir_all(&staging)?;
        }
        fs::create_dir_all(&staging)?;
        Ok(Store {
            root: root.to_path_buf(),
            lazy: Arc::default(),
        })
    }

    /// The directory holding layer `id`.
    pub fn layer_dir(&self, id: &LayerId) -> PathBuf {
        self.root.join("layers").join(&id.0)
    }

    /// Every layer in the store.
    pub fn layers(&self) -> io::Result<Vec<LayerId>> {
        let mut ids: Vec<LayerId> = fs::read_dir(self.root.join("layers"))?
            .map(|e| e.map(|e| LayerId(e.file_name().to_string_lossy().into_owned())))
            .collect::<io::Result<_>>()?;
        ids.sort();
        Ok(ids)
    }

    /// The layer named `id`, if the store has it.
    pub fn layer(&self, id: &str) -> Option<LayerId> {
        let valid = !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit());
        let id = LayerId(id.to_string());
        (valid && self.layer_dir(&id).is_dir()).then_some(id)
    }

    /// Imports a directory (as [`Store::import_dir`]) or a tarball (as
    /// [`Store::import_tar`]), whichever `source` is, telling `progress`
    /// (bytes done, bytes in all) as it goes: a directory's file bytes
    /// copied, a tarball's bytes read.
    pub fn import(&self, source: &Path, progress: Progress<'_>) -> io::Result<LayerId> {
        let meta = fs::metadata(source)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", source.display())))?;
        if meta.is_dir() {
            self.import_dir_with(source, progress)
        } else {
            self.import_tar_with(source, progress)
        }
    }

    /// Removes layer `id`: first out of `layers/` with one rename, so a
    /// crash leaves the layer whole or gone, then its files.
    pub fn remove(&self, id: &LayerId) -> io::Result<()> {
        let doomed = self.staging_dir()?;
        fs::remove_dir(&doomed)?;
        fs::rename(self.layer_dir(id), &doomed)?;
        File::open(self.root.join("layers"))?.sync_all()?;
        self.lazy.detach(id);
        let lazy = self.lazy_dir(id);
        if lazy.exists() {
            remove_tree(&lazy)?;
        }
        remove_tree(&doomed)
    }

    /// Where lazy layer `id` keeps its state.
    fn lazy_dir(&self, id: &LayerId) -> PathBuf {
        self.root.join("lazy").join(&id.0)
    }

    /// Imports a lazy layer: the tree `entries` describe, every regular
    /// file at its size and all holes, its data to be brought from `source`
    /// piece by piece once the layer is attached ([`Store::attach_lazy`]).
    /// A layer of the same content already in the store is taken as it is.
    /// An entry that would land outside the layer fails the import.
    pub fn import_lazy(
        &self,
        entries: &[crate::lazy::Entry],
        source: &crate::lazy::Source,
    ) -> io::Result<LayerId> {
        let staged = self.staging_dir()?;
        let built = from_toc::write(&staged, entries).map(|made| (made.lazy, made.known));
        let (files, known) = match built {
            Ok(built) => built,
            Err(e) => {
                let _ = remove_tree(&staged);
                return Err(e);
            }
        };
        let id = LayerId(tree_digest_with(&staged, &known)?);
        if self.layer_dir(&id).exists() {
            remove_tree(&staged)?;
            return Ok(id);
        }
        let state = self.lazy_dir(&id);
        let _ = remove_tree(&state);
        fs::create_dir(&state)?;
        let index = crate::lazy::Index {
            source: source.clone(),
            files,
        };
        let json = serde_json::to_vec(&index).map_err(io::Error::other)?;
        let mut out = File::create(state.join(crate::lazy::INDEX))?;
        io::Write::write_all(&mut out, &json)?;
        out.sync_all()?;
        File::open(&state)?.sync_all()?;
        File::open(self.root.join("lazy"))?.sync_all()?;
        self.commit(staged, id)
    }

    /// Whether layer `id` is lazy (complete or not).
    pub fn is_lazy(&self, id: &LayerId) -> bool {
        self.lazy_dir(id).is_dir()
    }

    /// The store's lazy layers (complete ones included: they lend pieces
    /// to others).
    pub fn lazy_layers(&self) -> io::Result<Vec<LayerId>> {
        let mut ids: Vec<LayerId> = fs::read_dir(self.root.join("lazy"))?
            .map(|e| e.map(|e| LayerId(e.file_name().to_string_lossy().into_owned())))
            .collect::<io::Result<_>>()?;
        ids.retain(|id| self.layer_dir(id).is_dir());
        ids.sort();
        Ok(ids)
    }

    /// The source of lazy layer `id`, read from its index without
    /// attaching it.
    pub fn lazy_source(&self, id: &LayerId) -> io::Result<crate::lazy::Source> {
        #[derive(serde::Deserialize)]
        struct Head {
            source: crate::lazy::Source,
        }
        let head: Head =
            serde_json::from_slice(&fs::read(self.lazy_dir(id).join(crate::lazy::INDEX))?)
                .map_err(io::Error::other)?;
        Ok(head.source)
    }

    /// Attaches lazy layer `id` to this store: reads of its files that
    /// wait for data bring it through `fetch` first. Attached already, it
    /// is given `fetch` (if one).
    pub fn attach_lazy(
        &self,
        id: &LayerId,
        fetch: Option<Arc<dyn crate::lazy::Fetch>>,
    ) -> io::Result<Arc<LazyLayer>> {
        self.lazy
            .attach(id, &self.layer_dir(id), &self.lazy_dir(id), fetch)
    }

    /// The lazy layers this store has attached.
    pub fn lazy(&self) -> &Attached {
        &self.lazy
    }

    /// Lazy layer `id`, if attached.
    pub fn lazy_layer(&self, id: &LayerId) -> Option<Arc<LazyLayer>> {
        self.lazy.get(id)
    }

    /// Serves `lowers` (bottom first) under `upper`, as [`StackFs::open`],
    /// each of this store's lazy layers among them read through its fill:
    /// one not attached yet is attached here, without a fetcher until it is
    /// given one ([`Store::attach_lazy`]), so that a read of what it lacks
    /// fails rather than shows its holes.
    pub fn open_stack(
        &self,
        lowers: &[PathBuf],
        upper: &Path,
        state: &Path,
    ) -> io::Result<StackFs> {
        self.attach_waiting(lowers)?;
        StackFs::open_with(lowers, upper, state, Some(self.lazy.clone()))
    }

    /// [`Store::open_stack`] with the state inside the upper, as
    /// [`StackFs::open_in_upper`].
    pub fn open_stack_in_upper(&self, lowers: &[PathBuf], upper: &Path) -> io::Result<StackFs> {
        std::fs::create_dir_all(upper)?;
        self.open_stack(lowers, upper, &upper.join(crate::STATE_IN_UPPER))
    }

    /// Attaches every lazy layer of this store among `lowers` that still
    /// waits for data and is not attached.
    fn attach_waiting(&self, lowers: &[PathBuf]) -> io::Result<()> {
        let layers = self.root.join("layers").canonicalize()?;
        for lower in lowers {
            let lower = lower.canonicalize()?;
            let Some(id) = lower
                .parent()
                .filter(|&dir| dir == layers)
                .and(lower.file_name())
                .and_then(|name| self.layer(&name.to_string_lossy()))
            else {
                continue;
            };
            if self.lazy.get(&id).is_none() && waiting_state(&lower).is_some() {
                self.attach_lazy(&id, None)?;
            }
        }
        Ok(())
    }

    /// Imports a copy of the tree at `src` (symlinks copied, not followed).
    pub fn import_dir(&self, src: &Path) -> io::Result<LayerId> {
        self.import_dir_with(src, &mut |_, _| {})
    }

    /// [`Store::import_dir`], telling `progress` the file bytes copied.
    pub fn import_dir_with(&self, src: &Path, progress: Progress<'_>) -> io::Result<LayerId> {
        let total = from_dir::file_bytes(src)?;
        let mut copied = Copied {
            done: 0,
            total,
            progress,
        };
        self.stage(|layer| from_dir::copy_tree(src, layer, &mut copied))
    }

    /// Imports an OCI/Docker layer tarball, plain or gzip-compressed. Its
    /// whiteout files stay as they are. An entry that would land outside the
    /// layer (`../`, an absolute path, a path through a symlink) fails the
    /// import and nothing of it is kept.
    pub fn import_tar(&self, tarball: &Path) -> io::Result<LayerId> {
        self.import_tar_with(tarball, &mut |_, _| {})
    }

    /// [`Store::import_tar`], telling `progress` the tarball's bytes read.
    pub fn import_tar_with(&self, tarball: &Path, progress: Progress<'_>) -> io::Result<LayerId> {
        let mut file = BufReader::new(File::open(tarball)?);
        let mut magic = [0u8; 2];
        let gzip = file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
        let file = File::open(tarball)?;
        let total = file.metadata()?.len();
        let mut copied = Copied {
            done: 0,
            total,
            progress,
        };
        let file = BufReader::new(Counted {
            inner: file,
            copied: &mut copied,
        });
        if gzip {
            self.import_tar_stream(flate2::read::MultiGzDecoder::new(file))
        } else {
            self.import_tar_stream(file)
        }
    }

    /// Imports the uncompressed tar stream `reader`, as [`Store::import_tar`].
    pub fn import_tar_stream(&self, reader: impl Read) -> io::Result<LayerId> {
        self.stage(|layer| from_tar::unpack(reader, layer, &[]))
    }

    /// Imports a tar stream that `feed` hands to the unpacker it is given,
    /// as [`Store::import_tar`], but for its entries at the paths
    /// `leave_out` (what a format adds for its own readers, not files of
    /// the layer). `feed` may check what it read afterwards (digests of the
    /// compressed and uncompressed bytes): until it returns `Ok` nothing is
    /// in `layers/`, and an error leaves nothing at all.
    pub fn import_tar_checked(
        &self,
        leave_out: &[&str],
        feed: impl FnOnce(Unpack<'_>) -> io::Result<()>,
    ) -> io::Result<LayerId> {
        self.stage(|layer| feed(&mut |reader| from_tar::unpack(reader, &mut *layer, leave_out)))
    }

    /// Builds a layer in a fresh staging directory with `build`, then
    /// commits it; on failure nothing of it is left.
    fn stage(&self, build: impl FnOnce(&mut LayerWriter) -> io::Result<()>) -> io::Result<LayerId> {
        let staged = self.staging_dir()?;
        let written = LayerWriter::new(&staged).and_then(|mut layer| {
            build(&mut layer)?;
            layer.finish()
        });
        match written {
            Ok(known) => {
                let id = LayerId(tree_digest_with(&staged, &known)?);
                self.commit(staged, id)
            }
            Err(e) => {
                let _ = remove_tree(&staged);
                Err(e)
            }
        }
    }

    fn staging_dir(&self) -> io::Result<PathBuf> {
        let n = STAGING_SEQ.fetch_add(1, Relaxed);
        let dir = self
            .root
            .join("staging")
            .join(format!("{}-{n}", std::process::id()));
        fs::create_dir(&dir)?;
        Ok(dir)
    }

    /// Moves the durable staged tree into place as layer `id` (its tree's
    /// digest), durably.
    fn commit(&self, staged: PathBuf, id: LayerId) -> io::Result<LayerId> {
        let target = self.layer_dir(&id);
        if target.exists() {
            // The same content is already a layer: imports are idempotent.
            remove_tree(&staged)?;
            return Ok(id);
        }
        fs::rename(&staged, &target)?;
        File::open(self.root.join("layers"))?.sync_all()?;
        tracing::info!(layer = %id, "imported");
        Ok(id)
    }
}

/// The lazy state of the store layer at `layer_dir` (canonical), if it is
/// a lazy layer not complete yet: its files may still be holes.
pub(crate) fn waiting_state(layer_dir: &Path) -> Option<PathBuf> {
    let layers = layer_dir.parent()?;
    if layers.file_name()? != "layers" {
        return None;
    }
    let state = layers.parent()?.join("lazy").join(layer_dir.file_name()?);
    (state.is_dir() && !state.join(crate::lazy::COMPLETE).exists()).then_some(state)
}

/// Refuses the layer at `layer_dir` (canonical) where it is a lazy layer
/// still waiting for data that `lazy`, its store's, has not attached:
/// read any other way, its files would show their holes.
pub(crate) fn check_gated(layer_dir: &Path, lazy: Option<&Attached>) -> io::Result<()> {
    if waiting_state(layer_dir).is_none() {
        return Ok(());
    }
    let id = LayerId(
        layer_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    match lazy.and_then(|lazy| lazy.get(&id)) {
        Some(layer) if layer.root() == layer_dir => Ok(()),
        _ => Err(io::Error::other(format!(
            "{}: a lazy layer whose data is still coming, opened without its store",
            layer_dir.display()
        ))),
    }
}

const OUTSIDE: &str = "would land outside the layer";

/// Unpacks one tar stream into the layer being imported.
pub type Unpack<'a> = &'a mut dyn FnMut(&mut dyn Read) -> io::Result<()>;

/// Told (bytes done, bytes in all) as an import goes.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// Bytes an import has gone through, and whom to tell.
struct Copied<'a> {
    done: u64,
    total: u64,
    progress: Progress<'a>,
}

impl Copied<'_> {
    fn add(&mut self, bytes: u64) {
        self.done += bytes;
        (self.progress)(self.done, self.total.max(self.done));
    }
}

/// A reader that counts what is read through it.
struct Counted<'c, 'p, R> {
    inner: R,
    copied: &'c mut Copied<'p>,
}

impl<R: Read> Read for Counted<'_, '_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.copied.add(n as u64);
        Ok(n)
    }
}

/// Removes the tree at `path`, read-only directories included (a layer's
/// directories keep the modes they were imported with).
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            let _ = make_writable(path);
            fs::remove_dir_all(path)
        }
        other => other,
    }
}

/// Gives the owner write and search permission on every directory under
/// `dir`, so its entries can be removed.
fn make_writable(dir: &Path) -> io::Result<()> {
    let mode = fs::symlink_metadata(dir)?.mode();
    fs::set_permissions(dir, fs::Permissions::from_mode((mode & 0o7777) | 0o700))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            make_writable(&entry.path())?;
        }
    }
    Ok(())
}
