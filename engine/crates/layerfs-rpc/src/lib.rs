//! ONC-RPC over TCP (RFC 5531) for layerfs.
//!
//! The transport knows nothing of NFS: it frames records ([`record`]), decodes
//! the call envelope ([`envelope`]), routes calls to registered [`Program`]s
//! ([`program`]), sends each reply in one write ([`reply`]) and runs the
//! connections ([`server`]); [`xdr`] is the one XDR cursor and padding rule
//! every layer reads with. Everything but `server` is sans-IO or generic
//! over `Read`/`Write`, so tests drive it without sockets.
// Each use of `unsafe` is allowed where it is, with its reason.
#![deny(unsafe_code)]

mod awake;
pub mod envelope;
pub mod latency;
pub mod peer;
pub mod program;
pub mod record;
pub mod reply;
pub mod server;
mod spares;
mod timeouts;
pub mod xdr;

pub use envelope::{AuthSys, Credentials};
pub use program::{
    Call, Decoded, DecodedArgs, Dispatcher, Outcome, Placement, ProcedureStats, Program, Refusal,
    Routed,
};
pub use record::{Receive, Record, Records, READ_AHEAD, RECORD_LIMIT};
pub use reply::{FileTail, Frame, ReplyBuf, ReplyWriter, Transmit};
pub use server::{Admission, Server, ServerConfig, ServerHandle, TransportStats};
