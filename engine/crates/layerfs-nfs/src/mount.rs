//! MOUNT version 3 (RFC 1813 appendix I): hands out the root handle.

use parking_lot::Mutex;
use std::sync::Arc;

use layerfs_rpc::xdr::Cursor;
use layerfs_rpc::{Call, Credentials, DecodedArgs, Program, Refusal, ReplyBuf};
use nfs3_types::mount::{
    dirpath, export_node, fhandle3, mountbody, mountres3, mountres3_ok, mountstat3, name,
};
use nfs3_types::xdr_codec::{List, Opaque, Pack};

use layerfs_vfs::{Error, FileKind};
use nfs3_types::nfs3::nfs_fh3;

use crate::export::Exports;
use crate::{MOUNT_PROGRAM, MOUNT_VERSION};

/// MOUNT's procedures: their numbers and names in one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Proc {
    Null,
    Mnt,
    Dump,
    Umnt,
    Umntall,
    Export,
}

impl Proc {
    /// By procedure number.
    const ALL: [(Proc, &'static str); 6] = [
        (Proc::Null, "NULL"),
        (Proc::Mnt, "MNT"),
        (Proc::Dump, "DUMP"),
        (Proc::Umnt, "UMNT"),
        (Proc::Umntall, "UMNTALL"),
        (Proc::Export, "EXPORT"),
    ];

    fn from_number(n: u32) -> Option<Proc> {
        Self::ALL.get(n as usize).map(|&(p, _)| p)
    }

    fn name(n: u32) -> Option<&'static str> {
        Self::ALL.get(n as usize).map(|&(_, called)| called)
    }
}

/// AUTH_SYS, the one flavor served.
const AUTH_UNIX: u32 = 1;

/// MOUNT version 3 for a server's exports, each mountable by its path or
/// its host path, and at any directory below.
pub struct MountProgram {
    exports: Arc<Exports>,
    /// (client address, path) of MNTs not yet UMNTed, for DUMP.
    mounts: Mutex<Vec<(String, Vec<u8>)>>,
}

impl MountProgram {
    pub fn new(exports: Arc<Exports>) -> Self {
        MountProgram {
            exports,
            mounts: Mutex::new(Vec::new()),
        }
    }

    /// The directory a MNT path names: an export's path or host path, or a
    /// directory below either (as the Linux server allows), looked up as
    /// the caller the export takes `cred` for.
    fn resolve(&self, path: &[u8], cred: &Credentials) -> Result<nfs_fh3, mountstat3> {
        let (export, rest) = self
            .exports
            .for_path(path)
            .ok_or(mountstat3::MNT3ERR_NOENT)?;
        let who = export.caller(cred);
        let who = &who;
        let fs = &export.fs;
        let mut dir = fs.getattr(fs.root()).map_err(|_| mountstat3::MNT3ERR_IO)?;
        for component in rest.split(|&b| b == b'/').filter(|n| !n.is_empty()) {
            dir = fs.lookup(who, dir.fileid, component).map_err(|e| match e {
                Error::NotDir => mountstat3::MNT3ERR_NOTDIR,
                Error::Access | Error::Perm => mountstat3::MNT3ERR_ACCES,
                Error::NameTooLong => mountstat3::MNT3ERR_NAMETOOLONG,
                Error::Inval => mountstat3::MNT3ERR_INVAL,
                _ => mountstat3::MNT3ERR_NOENT,
            })?;
        }
        if dir.kind != FileKind::Directory {
            return Err(mountstat3::MNT3ERR_NOTDIR);
        }
        Ok(export.handle(&dir))
    }
}

/// The directory path of MNT and UMNT, its length checked before anything
/// is allocated for it.
fn path_arg(args: &[u8]) -> Result<Vec<u8>, Refusal> {
    Cursor::new(args)
        .opaque(nfs3_types::mount::MNTPATHLEN)
        .map(<[u8]>::to_vec)
        .ok_or(Refusal::GarbageArgs)
}

fn put(reply: &mut ReplyBuf, value: &impl Pack) -> Result<(), Refusal> {
    value
        .pack(reply)
        .map(|_| ())
        .map_err(|_| Refusal::SystemErr)
}

/// Mounts the DUMP list keeps at most; past it the oldest is forgotten. The
/// list is advisory (RFC 1813 §5.2.3): clients that never UMNT must not
/// grow it without bound.
const MOUNT_LIST_MAX: usize = 256;

impl MountProgram {
    /// Adds a mount to the DUMP list, once per client and path.
    fn remember(&self, client: String, path: Vec<u8>) {
        let mut mounts = self.mounts.lock();
        if mounts.iter().any(|(c, p)| *c == client && *p == path) {
            return;
        }
        if mounts.len() >= MOUNT_LIST_MAX {
            mounts.remove(0);
        }
        mounts.push((client, path));
    }
}

impl Program for MountProgram {
    fn number(&self) -> u32 {
        MOUNT_PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (MOUNT_VERSION, MOUNT_VERSION)
    }

    fn procedure_name(&self, proc: u32) -> Option<&'static str> {
        Proc::name(proc)
    }

    fn call(
        &self,
        call: &Call<'_>,
        _args: &DecodedArgs,
        reply: &mut ReplyBuf,
    ) -> Result<(), Refusal> {
        let client = call.peer.map(|p| p.to_string()).unwrap_or_default();
        match Proc::from_number(call.proc).ok_or(Refusal::ProcUnavail)? {
            Proc::Null => Ok(()),
            Proc::Mnt => {
                let path = path_arg(call.args)?;
                let res = match self.resolve(&path, call.cred) {
                    Ok(fh) => {
                        self.remember(client, path);
                        mountres3::Ok(mountres3_ok {
                            fhandle: fhandle3(fh.data),
                            auth_flavors: vec![AUTH_UNIX],
                        })
                    }
                    Err(stat) => {
                        tracing::info!(%client, path = %String::from_utf8_lossy(&path), "MNT refused: {stat}");
                        mountres3::Err(stat)
                    }
                };
                put(reply, &res)
            }
            Proc::Dump => {
                let mounts = self.mounts.lock();
                let list: List<mountbody<'_, '_>> = List(
                    mounts
                        .iter()
                        .map(|(host, path)| mountbody {
                            ml_hostname: name(Opaque::borrowed(host.as_bytes())),
                            ml_directory: dirpath(Opaque::borrowed(path)),
                        })
                        .collect(),
                );
                put(reply, &list)
            }
            Proc::Umnt => {
                let path = path_arg(call.args)?;
                self.mounts
                    .lock()
                    .retain(|(host, p)| !(host == &client && p == &path));
                Ok(())
            }
            Proc::Umntall => {
                self.mounts.lock().retain(|(host, _)| host != &client);
                Ok(())
            }
            Proc::Export => {
                let exports = self.exports.list();
                let list = List(
                    exports
                        .iter()
                        .map(|e| export_node {
                            ex_dir: dirpath(Opaque::borrowed(&e.path)),
                            ex_groups: List(Vec::new()),
                        })
                        .collect(),
                );
                put(reply, &list)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procedures_are_numbered_as_rfc_1813_numbers_them() {
        for (n, (proc, called)) in Proc::ALL.iter().enumerate() {
            assert_eq!(Proc::from_number(n as u32), Some(*proc));
            assert_eq!(Proc::name(n as u32), Some(*called));
        }
        assert_eq!(Proc::from_number(3), Some(Proc::Umnt));
        assert_eq!(Proc::from_number(6), None);
        assert_eq!(Proc::name(6), None);
    }
}
