//! FUSE mounts that outlive the daemon: each is handed to the keeper
//! (`crate::keeper`) once mounted and taken back from it once unmounted,
//! and a daemon that starts serves again the sessions the keeper holds
//! instead of mounting afresh.
//!
//! The keeper is a help, not a need: where it cannot be started or
//! reached, mounts work as before and die with the daemon.

use std::collections::BTreeMap;
use std::path::Path;

use layerfs_fuse::{Kept, Mounted};

use super::Daemon;
use crate::keeper::Keeper;

/// The daemon's keeper, and the sessions it held when this daemon started
/// that no recorded mount has taken over yet.
#[derive(Default)]
pub(super) struct Handover {
    keeper: Option<Keeper>,
    waiting: BTreeMap<String, Kept>,
}

impl Daemon {
    /// Reaches the store's keeper (started with `program keeper` if none
    /// runs) and takes what it holds, for [`Daemon::mount_recorded`].
    pub(super) fn start_keeper(&self, program: Option<&Path>) {
        let Some(program) = program else { return };
        let keeper = match Keeper::connect_or_start(&self.root, program) {
            Ok(k) => k,
            Err(e) => {
                return tracing::warn!("no keeper: FUSE mounts will not outlive this daemon: {e}")
            }
        };
        let mut handover = self.handover.lock();
        match keeper.held() {
            Ok(held) => handover.waiting = held,
            Err(e) => tracing::warn!("the keeper's sessions could not be taken: {e}"),
        }
        handover.keeper = Some(keeper);
    }

    /// Whether a keeper holds this daemon's FUSE sessions.
    pub(super) fn has_keeper(&self) -> bool {
        self.handover.lock().keeper.is_some()
    }

    /// The live session the keeper holds for workspace `name`, if any.
    pub(super) fn handed_over(&self, name: &str) -> Option<Kept> {
        self.handover.lock().waiting.remove(name)
    }

    /// Has the keeper hold a copy of `mounted`'s session.
    pub(super) fn keep(&self, name: &str, mounted: &Mounted) {
        let handover = self.handover.lock();
        let Some(keeper) = &handover.keeper else {
            return;
        };
        if let Err(e) = mounted.kept().and_then(|kept| keeper.keep(name, &kept)) {
            tracing::warn!(workspace = %name, "its FUSE mount will not outlive this daemon: {e}");
        }
    }

    /// Has the keeper close its copy of `name`'s session: done before an
    /// unmount, and where a session cannot be served again (its
    /// connection then ends, and the mount answers ENOTCONN until mounted
    /// afresh).
    pub(super) fn forget_kept(&self, name: &str) {
        let mut handover = self.handover.lock();
        handover.waiting.remove(name);
        if let Some(keeper) = &handover.keeper {
            if let Err(e) = keeper.forget(name) {
                tracing::warn!(workspace = %name, "the keeper: {e}");
            }
        }
    }

    /// Ends the sessions no recorded mount took over (a workspace removed
    /// or unmounted while no daemon ran).
    pub(super) fn forget_unclaimed(&self) {
        let names: Vec<String> = self.handover.lock().waiting.keys().cloned().collect();
        for name in names {
            tracing::info!(workspace = %name, "a kept FUSE session no mount claims: ended");
            self.forget_kept(&name);
        }
    }

    /// Serves `name` at `path` again through the session the keeper holds,
    /// if it holds one that can be served; else the session is ended.
    pub(super) fn take_over(
        &self,
        name: &str,
        path: &Path,
        fs: std::sync::Arc<dyn layerfs_vfs::Filesystem>,
        options: &layerfs_fuse::Options,
    ) -> Option<Mounted> {
        let kept = self.handed_over(name)?;
        match layerfs_fuse::resume(fs, path, kept, options) {
            Ok(mounted) => {
                tracing::info!(workspace = %name, path = %path.display(), "FUSE session taken over, not mounted afresh");
                Some(mounted)
            }
            Err(e) => {
                tracing::warn!(workspace = %name, "the kept FUSE session cannot be served: {e}");
                self.forget_kept(name);
                None
            }
        }
    }
}
