//! [`Workspace`]: a stack of layers with its upper, kept in one directory,
//! which can commit its upper as a new layer.
//!
//! ```text
//! <dir>/stack       the stack: one directory per line, bottom first; the last is the upper
//! <dir>/tree/<n>/   uppers, current and committed (a committed one is a layer)
//! <dir>/state/      the inode map, copy-up staging, files removed while open
//! ```
//!
//! `stack` is the only record of which directories form the workspace; it
//! is replaced whole (written aside, synced, renamed, directory synced), so
//! a crash leaves the old stack or the new one.

use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerfs_vfs::{Error, FileId};

use crate::{StackFs, Store};

pub struct Workspace {
    dir: PathBuf,
    fs: Arc<StackFs>,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn vfs(e: Error) -> io::Error {
    io::Error::other(e)
}

impl Workspace {
    /// Makes a workspace in `dir` (which must not exist yet) over `layers`,
    /// bottom first, with an empty upper.
    pub fn create(dir: &Path, layers: &[PathBuf]) -> io::Result<Workspace> {
        Self::create_in(dir, layers, None)
    }

    /// [`Workspace::create`] over layers of `store`, whose lazy layers are
    /// read through their fill ([`Store::open_stack`]).
    pub fn create_in(
        dir: &Path,
        layers: &[PathBuf],
        store: Option<&Store>,
    ) -> io::Result<Workspace> {
        std::fs::create_dir(dir)?;
        let dir = dir.canonicalize()?;
        let upper = dir.join("tree").join("1");
        std::fs::create_dir_all(&upper)?;
        let mut stack = layers
            .iter()
            .map(|l| l.canonicalize())
            .collect::<io::Result<Vec<_>>>()?;
        stack.push(upper);
        write_stack(&dir, &stack)?;
        Self::open_in(&dir, store)
    }

    /// Opens the workspace in `dir`; a lazy layer still waiting for data is
    /// refused ([`Workspace::open_in`] reads it).
    pub fn open(dir: &Path) -> io::Result<Workspace> {
        Self::open_in(dir, None)
    }

    /// Opens the workspace in `dir`, whose layers are `store`'s where given.
    pub fn open_in(dir: &Path, store: Option<&Store>) -> io::Result<Workspace> {
        let dir = dir.canonicalize()?;
        let mut stack = read_stack(&dir)?;
        let upper = stack
            .pop()
            .ok_or_else(|| invalid(format!("{}: empty stack", dir.display())))?;
        remove_unstacked(&dir.join("tree"), &stack, &upper)?;
        let state = dir.join("state");
        let fs = match store {
            Some(store) => store.open_stack(&stack, &upper, &state)?,
            None => StackFs::open(&stack, &upper, &state)?,
        };
        Ok(Workspace {
            dir,
            fs: Arc::new(fs),
        })
    }

    /// The stack of the workspace in `dir`, bottom first, its upper last,
    /// read without opening it.
    pub fn stack_of(dir: &Path) -> io::Result<Vec<PathBuf>> {
        read_stack(dir)
    }

    /// The filesystem clients are served.
    pub fn fs(&self) -> Arc<StackFs> {
        self.fs.clone()
    }

    /// The read-only layers, bottom first: what another workspace can be
    /// made on.
    pub fn layers(&self) -> Vec<PathBuf> {
        let mut stack = self.fs.stack();
        stack.pop();
        stack
    }

    /// Turns the upper into a new read-only layer, all or nothing, and goes
    /// on with an empty upper; every file keeps its id and handle. The layer
    /// holds what the workspace held at one moment during the call: files
    /// in `written_directly` (written by descriptors that do not ask the
    /// filesystem: FUSE passthrough) go on in the new upper, and the layer
    /// keeps a copy. Returns the new layer's directory.
    pub fn commit(&self, written_directly: &[FileId]) -> io::Result<PathBuf> {
        let tree = self.dir.join("tree");
        let next = std::fs::read_dir(&tree)?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
            + 1;
        let new_upper = tree.join(next.to_string());
        let committed = self.fs.stack().pop().expect("a stack has an upper");
        self.fs
            .commit_upper(&new_upper, written_directly, |stack| {
                write_stack(&self.dir, stack).map_err(Error::from)
            })
            .map_err(vfs)?;
        Ok(committed)
    }
}

/// Removes the uppers in `tree` that the stack does not hold: one made by a
/// commit that a crash cut short before the stack was recorded.
fn remove_unstacked(tree: &Path, stack: &[PathBuf], upper: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(tree)? {
        let path = entry?.path();
        let canonical = path.canonicalize()?;
        if canonical != upper && !stack.contains(&canonical) {
            tracing::info!("{}: not in the stack, removed", path.display());
            crate::remove_tree(&path)?;
        }
    }
    Ok(())
}

fn read_stack(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read(dir.join("stack"))?;
    Ok(text
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| PathBuf::from(std::ffi::OsStr::from_bytes(l)))
        .collect())
}

fn write_stack(dir: &Path, stack: &[PathBuf]) -> io::Result<()> {
    let mut text = Vec::new();
    for path in stack {
        let bytes = path.as_os_str().as_bytes();
        if bytes.contains(&b'\n') {
            return Err(invalid(format!(
                "{}: a newline in a layer's path",
                path.display()
            )));
        }
        text.extend_from_slice(bytes);
        text.push(b'\n');
    }
    let aside = dir.join("stack.new");
    let mut file = std::fs::File::create(&aside)?;
    file.write_all(&text)?;
    file.sync_all()?;
    std::fs::rename(&aside, dir.join("stack"))?;
    std::fs::File::open(dir)?.sync_all()
}
