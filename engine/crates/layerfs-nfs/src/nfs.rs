use layerfs_rpc::{Call, Program, Refusal, ReplyBuf};

use crate::{NFS_PROGRAM, NFS_VERSION};

const PROCEDURES: [&str; 22] = [
    "NULL",
    "GETATTR",
    "SETATTR",
    "LOOKUP",
    "ACCESS",
    "READLINK",
    "READ",
    "WRITE",
    "CREATE",
    "MKDIR",
    "SYMLINK",
    "MKNOD",
    "REMOVE",
    "RMDIR",
    "RENAME",
    "LINK",
    "READDIR",
    "READDIRPLUS",
    "FSSTAT",
    "FSINFO",
    "PATHCONF",
    "COMMIT",
];

/// NFS version 3.
#[derive(Default)]
pub struct NfsProgram;

impl Program for NfsProgram {
    fn number(&self) -> u32 {
        NFS_PROGRAM
    }

    fn versions(&self) -> (u32, u32) {
        (NFS_VERSION, NFS_VERSION)
    }

    fn procedure_name(&self, proc: u32) -> Option<&'static str> {
        PROCEDURES.get(proc as usize).copied()
    }

    fn call(&self, call: &Call<'_>, _reply: &mut ReplyBuf) -> Result<(), Refusal> {
        match call.proc {
            0 => Ok(()),
            _ => Err(Refusal::ProcUnavail),
        }
    }
}
