//! MOUNT version 3 (RFC 1813 appendix I): hands out the root handle.

use std::sync::{Arc, Mutex};

use layerfs_rpc::{Call, Program, Refusal, ReplyBuf};
use nfs3_types::mount::{
    dirpath, export_node, fhandle3, mountbody, mountres3, mountres3_ok, mountstat3, name,
};
use nfs3_types::xdr_codec::{List, Opaque, Pack, Unpack};

use crate::export::Export;
use crate::{MOUNT_PROGRAM, MOUNT_VERSION};

const PROCEDURES: [&str; 6] = ["NULL", "MNT", "DUMP", "UMNT", "UMNTALL", "EXPORT"];
/// AUTH_SYS, the one flavor served.
const AUTH_UNIX: u32 = 1;

/// MOUNT version 3 for one export, mountable as `/` or by its host path.
pub struct MountProgram {
    export: Arc<Export>,
    /// (client address, path) of MNTs not yet UMNTed, for DUMP.
    mounts: Mutex<Vec<(String, Vec<u8>)>>,
}

impl MountProgram {
    pub fn new(export: Arc<Export>) -> Self {
        MountProgram {
            export,
            mounts: Mutex::new(Vec::new()),
        }
    }

    fn serves(&self, path: &[u8]) -> bool {
        let trimmed = |p: &[u8]| -> Vec<u8> {
            let mut p = p.to_vec();
            while p.len() > 1 && p.ends_with(b"/") {
                p.pop();
            }
            p
        };
        let path = trimmed(path);
        path == b"/" || path == trimmed(&self.export.host_path)
    }
}

fn path_arg(args: &[u8]) -> Result<Vec<u8>, Refusal> {
    let mut r = args;
    let (path, _) = dirpath::unpack(&mut r).map_err(|_| Refusal::GarbageArgs)?;
    if path.0.len() > nfs3_types::mount::MNTPATHLEN {
        return Err(Refusal::GarbageArgs);
    }
    Ok(path.0.to_vec())
}

fn put(reply: &mut ReplyBuf, value: &impl Pack) -> Result<(), Refusal> {
    value
        .pack(reply)
        .map(|_| ())
        .map_err(|_| Refusal::SystemErr)
}

impl Program for MountProgram {
    fn number(&self) -> u32 {
        MOUNT_PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (MOUNT_VERSION, MOUNT_VERSION)
    }

    fn procedure_name(&self, proc: u32) -> Option<&'static str> {
        PROCEDURES.get(proc as usize).copied()
    }

    fn call(&self, call: &Call<'_>, reply: &mut ReplyBuf) -> Result<(), Refusal> {
        let client = call.peer.map(|p| p.to_string()).unwrap_or_default();
        match call.proc {
            0 => Ok(()),
            1 => {
                let path = path_arg(call.args)?;
                let res = if !self.serves(&path) {
                    tracing::info!(%client, path = %String::from_utf8_lossy(&path), "MNT of an unknown export");
                    mountres3::Err(mountstat3::MNT3ERR_NOENT)
                } else {
                    match self.export.root_handle() {
                        Ok(fh) => {
                            self.mounts
                                .lock()
                                .expect("mounts poisoned")
                                .push((client, path));
                            mountres3::Ok(mountres3_ok {
                                fhandle: fhandle3(fh.data),
                                auth_flavors: vec![AUTH_UNIX],
                            })
                        }
                        Err(_) => mountres3::Err(mountstat3::MNT3ERR_IO),
                    }
                };
                put(reply, &res)
            }
            2 => {
                let mounts = self.mounts.lock().expect("mounts poisoned");
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
            3 => {
                let path = path_arg(call.args)?;
                self.mounts
                    .lock()
                    .expect("mounts poisoned")
                    .retain(|(host, p)| !(host == &client && p == &path));
                Ok(())
            }
            4 => {
                self.mounts
                    .lock()
                    .expect("mounts poisoned")
                    .retain(|(host, _)| host != &client);
                Ok(())
            }
            5 => {
                let list = List(vec![export_node {
                    ex_dir: dirpath(Opaque::borrowed(b"/")),
                    ex_groups: List(Vec::new()),
                }]);
                put(reply, &list)
            }
            _ => Err(Refusal::ProcUnavail),
        }
    }
}
