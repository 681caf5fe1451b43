//! The request dispatcher, reachable from the fuzz targets (the `fuzzing`
//! feature): a kernel's request as bytes in, the answer's bytes out.

use std::sync::Arc;

use layerfs_vfs::Filesystem;

use crate::abi::InHeader;
use crate::attrs::Caching;
use crate::door::Door;
use crate::wire::{self, Answered, Body};

/// A door over a filesystem, without a kernel.
pub struct Dispatcher {
    door: Door,
    answered: Answered,
}

impl Dispatcher {
    pub fn over(fs: Arc<dyn Filesystem>) -> Dispatcher {
        Dispatcher {
            door: Door::new(fs, Caching::Exclusive, false),
            answered: Answered::default(),
        }
    }

    /// Answers request `opcode` on node `nodeid` from `uid`/`gid`, its
    /// operation's struct `op` and the rest `payload` laid out as a ring
    /// lays them: the errno (negative, or 0) and the answer's body.
    pub fn answer(
        &mut self,
        (opcode, nodeid): (u32, u64),
        (uid, gid): (u32, u32),
        op: &[u8],
        payload: &[u8],
    ) -> (i32, &[u8]) {
        let header = InHeader {
            opcode,
            nodeid,
            uid,
            gid,
            unique: 1,
            ..Default::default()
        };
        wire::answer(
            &self.door,
            &header,
            Body::split(op, payload, 0),
            &mut self.answered,
        );
        (self.answered.error, &self.answered.body)
    }
}
