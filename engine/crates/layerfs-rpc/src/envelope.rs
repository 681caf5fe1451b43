//! The RPC message envelope (RFC 5531 §9): decoding a call header and
//! encoding reply headers. Pure functions over byte slices.
//!
//! The call header is decoded here rather than with `nfs3_types`' `Unpack`
//! because that allocates whatever length a hostile credential claims before
//! reading it; here every length is checked against the record first.

use std::fmt;

use smallvec::SmallVec;

use nfs3_types::rpc::{
    accept_stat_data, accepted_reply, auth_flavor, auth_stat, msg_body, opaque_auth,
    rejected_reply, reply_body, rpc_msg, RPC_VERSION_2,
};
use nfs3_types::xdr_codec::Pack;

use crate::reply::ReplyBuf;
use crate::xdr::Cursor;

/// Largest credential or verifier body (RFC 5531 §8.2).
pub const MAX_AUTH_BYTES: usize = 400;
/// Largest AUTH_SYS machine name (RFC 5531 appendix A).
pub const MAX_MACHINE_NAME: usize = 255;
/// Most supplementary groups in an AUTH_SYS credential (RFC 5531 appendix A).
pub const MAX_GIDS: usize = 16;

const CALL: u32 = 0;
const REPLY: u32 = 1;

/// Who the caller says it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    None,
    Sys(AuthSys),
}

/// An AUTH_SYS credential. Its fields are kept inline, the machine name up
/// to 64 bytes and every group (at most 16): decoding one allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthSys {
    pub stamp: u32,
    pub machine_name: SmallVec<[u8; 64]>,
    pub uid: u32,
    pub gid: u32,
    pub gids: SmallVec<[u32; MAX_GIDS]>,
}

/// A decoded call header; the procedure's arguments follow at `args_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallHeader {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc: u32,
    pub cred: Credentials,
    pub args_at: usize,
}

/// What a record turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Envelope {
    Call(CallHeader),
    /// A call refused before reaching a program; answer with this.
    Denied {
        xid: u32,
        why: Denial,
    },
    /// Not a call we can answer at all; log it and move on.
    Drop(DropReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denial {
    RpcMismatch,
    Auth(AuthError),
}

/// The AUTH_ERROR reasons this server gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// Malformed credential or verifier, or a flavor this server does not take.
    BadCred,
    /// A flavor the program does not take for this procedure (AUTH_NONE
    /// where a caller's identity decides what it may do).
    TooWeak,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Fewer bytes than a call header needs.
    Truncated,
    /// A REPLY sent to the server.
    Reply,
    /// A message type that is neither CALL nor REPLY.
    BadMessageType(u32),
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DropReason::Truncated => f.write_str("record too short for an RPC call header"),
            DropReason::Reply => f.write_str("REPLY message sent to the server"),
            DropReason::BadMessageType(t) => write!(f, "unknown RPC message type {t}"),
        }
    }
}

/// Decodes the envelope of one record.
pub fn decode_call(record: &[u8]) -> Envelope {
    let mut r = Cursor::new(record);
    let (Some(xid), Some(mtype)) = (r.u32(), r.u32()) else {
        return Envelope::Drop(DropReason::Truncated);
    };
    match mtype {
        CALL => {}
        REPLY => return Envelope::Drop(DropReason::Reply),
        other => return Envelope::Drop(DropReason::BadMessageType(other)),
    }
    let (Some(rpcvers), Some(prog), Some(vers), Some(proc)) = (r.u32(), r.u32(), r.u32(), r.u32())
    else {
        return Envelope::Drop(DropReason::Truncated);
    };
    if rpcvers != RPC_VERSION_2 {
        return Envelope::Denied {
            xid,
            why: Denial::RpcMismatch,
        };
    }
    let bad_cred = Envelope::Denied {
        xid,
        why: Denial::Auth(AuthError::BadCred),
    };
    let Some((cred_flavor, cred_body)) = auth(&mut r) else {
        return bad_cred;
    };
    let Some((_verf_flavor, _verf_body)) = auth(&mut r) else {
        return bad_cred;
    };
    let cred = match cred_flavor {
        f if f == auth_flavor::AUTH_NULL as u32 => Credentials::None,
        f if f == auth_flavor::AUTH_UNIX as u32 => match decode_auth_sys(cred_body) {
            Some(sys) => Credentials::Sys(sys),
            None => return bad_cred,
        },
        _ => return bad_cred,
    };
    Envelope::Call(CallHeader {
        xid,
        prog,
        vers,
        proc,
        cred,
        args_at: r.position(),
    })
}

fn decode_auth_sys(body: &[u8]) -> Option<AuthSys> {
    let mut r = Cursor::new(body);
    let stamp = r.u32()?;
    let machine_name = SmallVec::from_slice(r.opaque(MAX_MACHINE_NAME)?);
    let uid = r.u32()?;
    let gid = r.u32()?;
    let count = r.u32()? as usize;
    if count > MAX_GIDS {
        return None;
    }
    let gids = (0..count)
        .map(|_| r.u32())
        .collect::<Option<SmallVec<_>>>()?;
    r.is_empty().then_some(AuthSys {
        stamp,
        machine_name,
        uid,
        gid,
        gids,
    })
}

/// A credential or verifier: its flavor and body.
fn auth<'a>(r: &mut Cursor<'a>) -> Option<(u32, &'a [u8])> {
    let flavor = r.u32()?;
    Some((flavor, r.opaque(MAX_AUTH_BYTES)?))
}

/// How an accepted call ended, as far as the RPC layer is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    Success,
    ProgUnavail,
    ProgMismatch { low: u32, high: u32 },
    ProcUnavail,
    GarbageArgs,
    SystemErr,
}

/// Starts a reply to `xid` with an accepted-reply header; a `Success` reply's
/// results are appended after it by the program.
pub fn accepted_reply(xid: u32, stat: Accepted) -> ReplyBuf {
    let reply_data = match stat {
        Accepted::Success => accept_stat_data::SUCCESS,
        Accepted::ProgUnavail => accept_stat_data::PROG_UNAVAIL,
        Accepted::ProgMismatch { low, high } => accept_stat_data::PROG_MISMATCH { low, high },
        Accepted::ProcUnavail => accept_stat_data::PROC_UNAVAIL,
        Accepted::GarbageArgs => accept_stat_data::GARBAGE_ARGS,
        Accepted::SystemErr => accept_stat_data::SYSTEM_ERR,
    };
    reply(
        xid,
        reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data,
        }),
    )
}

/// A complete denied reply.
pub fn denied_reply(xid: u32, why: Denial) -> ReplyBuf {
    let rejected = match why {
        Denial::RpcMismatch => rejected_reply::rpc_mismatch(RPC_VERSION_2, RPC_VERSION_2),
        Denial::Auth(AuthError::BadCred) => rejected_reply::auth_error(auth_stat::AUTH_BADCRED),
        Denial::Auth(AuthError::TooWeak) => rejected_reply::auth_error(auth_stat::AUTH_TOOWEAK),
    };
    reply(xid, reply_body::MSG_DENIED(rejected))
}

fn reply(xid: u32, body: reply_body<'_>) -> ReplyBuf {
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(body),
    };
    let mut buf = ReplyBuf::with_capacity(msg.packed_size());
    msg.pack(&mut buf).expect("packing into memory cannot fail");
    buf
}
