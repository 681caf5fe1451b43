use layerfs_rpc::{Call, Program, Refusal, ReplyBuf};

use crate::{MOUNT_PROGRAM, MOUNT_VERSION};

const PROCEDURES: [&str; 6] = ["NULL", "MNT", "DUMP", "UMNT", "UMNTALL", "EXPORT"];

/// MOUNT version 3.
#[derive(Default)]
pub struct MountProgram;

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

    fn call(&self, call: &Call<'_>, _reply: &mut ReplyBuf) -> Result<(), Refusal> {
        match call.proc {
            0 => Ok(()),
            _ => Err(Refusal::ProcUnavail),
        }
    }
}
