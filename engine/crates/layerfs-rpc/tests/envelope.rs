//! The call envelope and every reject case, as bytes in and bytes out.

mod support;

use layerfs_rpc::envelope::{decode_call, AuthError, Denial, DropReason, Envelope};
use layerfs_rpc::{AuthSys, Credentials, Dispatcher, Outcome, Program};
use support::{auth_sys, call_msg, words, TestProgram, TEST_PROG};

fn dispatcher() -> Dispatcher {
    let programs: Vec<Box<dyn Program>> = vec![Box::new(TestProgram::new())];
    Dispatcher::new(programs)
}

/// The reply body (mark stripped, after checking it is one last fragment).
fn reply_to(msg: &[u8]) -> Option<Vec<u8>> {
    match dispatcher().handle(msg, None) {
        Outcome::Reply(frame) | Outcome::ReplyThen(frame) => {
            let frame = frame.bytes();
            let mark = u32::from_be_bytes(frame[..4].try_into().unwrap());
            assert_eq!(
                mark,
                0x8000_0000 | (frame.len() as u32 - 4),
                "one last fragment"
            );
            Some(frame[4..].to_vec())
        }
        Outcome::Dropped => None,
    }
}

const XID: u32 = 0xA1B2_C3D4;
/// xid, REPLY, MSG_ACCEPTED, verifier AUTH_NONE with an empty body.
const ACCEPTED: [u32; 5] = [XID, 1, 0, 0, 0];

#[test]
fn an_auth_sys_call_decodes() {
    let cred = auth_sys(b"host", 501, 20, &[12, 61]);
    let msg = call_msg(XID, 2, TEST_PROG, 3, 1, (1, &cred), &words(&[9]));
    let Envelope::Call(header) = decode_call(&msg) else {
        panic!("not a call")
    };
    assert_eq!(
        (header.xid, header.prog, header.vers, header.proc),
        (XID, TEST_PROG, 3, 1)
    );
    assert_eq!(
        header.cred,
        Credentials::Sys(AuthSys {
            stamp: 7,
            machine_name: b"host".as_slice().into(),
            uid: 501,
            gid: 20,
            gids: [12, 61].as_slice().into(),
        })
    );
    assert_eq!(&msg[header.args_at..], words(&[9]));
}

#[test]
fn a_successful_call_replies_with_its_results() {
    let msg = call_msg(XID, 2, TEST_PROG, 2, 1, (0, &[]), &words(&[42]));
    let want = [&ACCEPTED[..], &[0, 42]].concat();
    assert_eq!(reply_to(&msg), Some(words(&want)));
}

#[test]
fn a_wrong_rpc_version_gets_rpc_mismatch_2_2() {
    let msg = call_msg(XID, 3, TEST_PROG, 2, 0, (0, &[]), &[]);
    assert_eq!(reply_to(&msg), Some(words(&[XID, 1, 1, 0, 2, 2])));
}

#[test]
fn an_unknown_program_gets_prog_unavail() {
    let msg = call_msg(XID, 2, 100_227, 3, 0, (0, &[]), &[]);
    assert_eq!(reply_to(&msg), Some(words(&[&ACCEPTED[..], &[1]].concat())));
}

#[test]
fn an_unknown_version_gets_prog_mismatch_with_the_range() {
    for vers in [1, 4] {
        let msg = call_msg(XID, 2, TEST_PROG, vers, 0, (0, &[]), &[]);
        assert_eq!(
            reply_to(&msg),
            Some(words(&[&ACCEPTED[..], &[2, 2, 3]].concat()))
        );
    }
}

#[test]
fn an_unknown_procedure_gets_proc_unavail() {
    let msg = call_msg(XID, 2, TEST_PROG, 2, 77, (0, &[]), &[]);
    assert_eq!(reply_to(&msg), Some(words(&[&ACCEPTED[..], &[3]].concat())));
}

#[test]
fn undecodable_arguments_get_garbage_args() {
    let msg = call_msg(XID, 2, TEST_PROG, 2, 1, (0, &[]), &[1, 2]);
    assert_eq!(reply_to(&msg), Some(words(&[&ACCEPTED[..], &[4]].concat())));
}

fn assert_bad_cred(msg: &[u8], what: &str) {
    assert_eq!(reply_to(msg), Some(words(&[XID, 1, 1, 1, 1])), "{what}");
}

#[test]
fn malformed_or_unknown_credentials_get_auth_badcred() {
    let long_name = auth_sys(&[b'a'; 256], 0, 0, &[]);
    assert_bad_cred(
        &call_msg(XID, 2, TEST_PROG, 2, 0, (1, &long_name), &[]),
        "machine name of 256 bytes",
    );
    let many_gids = auth_sys(b"h", 0, 0, &[1; 17]);
    assert_bad_cred(
        &call_msg(XID, 2, TEST_PROG, 2, 0, (1, &many_gids), &[]),
        "17 gids",
    );
    let mut trailing = auth_sys(b"h", 0, 0, &[]);
    trailing.extend_from_slice(&[0; 4]);
    assert_bad_cred(
        &call_msg(XID, 2, TEST_PROG, 2, 0, (1, &trailing), &[]),
        "bytes after the gids",
    );
    let short = auth_sys(b"h", 0, 0, &[1, 2])[..16].to_vec();
    assert_bad_cred(
        &call_msg(XID, 2, TEST_PROG, 2, 0, (1, &short), &[]),
        "a cut credential",
    );
    assert_bad_cred(
        &call_msg(XID, 2, TEST_PROG, 2, 0, (6, &[0; 8]), &[]),
        "RPCSEC_GSS",
    );
    assert_bad_cred(
        &call_msg(XID, 2, TEST_PROG, 2, 0, (3, &[]), &[]),
        "AUTH_DES",
    );
    // A credential body past 400 bytes: refused from its length alone.
    let mut huge = call_msg(XID, 2, TEST_PROG, 2, 0, (1, &[]), &[]);
    huge[28..32].copy_from_slice(&0xFFFF_FFF0u32.to_be_bytes());
    assert_bad_cred(&huge, "a 4 GiB credential");
    // A verifier cut short.
    let cut = call_msg(XID, 2, TEST_PROG, 2, 0, (0, &[]), &[]);
    assert_bad_cred(&cut[..cut.len() - 2], "a cut verifier");
}

#[test]
fn sixteen_gids_and_a_255_byte_name_are_accepted() {
    let cred = auth_sys(&[b'm'; 255], 1, 1, &[5; 16]);
    let msg = call_msg(XID, 2, TEST_PROG, 2, 0, (1, &cred), &[]);
    assert_eq!(reply_to(&msg), Some(words(&[&ACCEPTED[..], &[0]].concat())));
}

#[test]
fn replies_and_short_records_are_dropped() {
    let mut reply = call_msg(XID, 2, TEST_PROG, 2, 0, (0, &[]), &[]);
    reply[4..8].copy_from_slice(&1u32.to_be_bytes());
    assert_eq!(decode_call(&reply), Envelope::Drop(DropReason::Reply));
    assert_eq!(reply_to(&reply), None);
    for len in [0, 3, 7, 8, 23] {
        let msg = &call_msg(XID, 2, TEST_PROG, 2, 0, (0, &[]), &[])[..len];
        assert_eq!(
            decode_call(msg),
            Envelope::Drop(DropReason::Truncated),
            "{len} bytes"
        );
        assert_eq!(reply_to(msg), None);
    }
    let mut odd = call_msg(XID, 2, TEST_PROG, 2, 0, (0, &[]), &[]);
    odd[4..8].copy_from_slice(&9u32.to_be_bytes());
    assert_eq!(
        decode_call(&odd),
        Envelope::Drop(DropReason::BadMessageType(9))
    );
}

#[test]
fn a_denied_call_is_classified_before_its_credential() {
    let msg = call_msg(XID, 1, TEST_PROG, 2, 0, (6, &[]), &[]);
    assert_eq!(
        decode_call(&msg),
        Envelope::Denied {
            xid: XID,
            why: Denial::RpcMismatch
        }
    );
    let msg = call_msg(XID, 2, TEST_PROG, 2, 0, (6, &[]), &[]);
    assert_eq!(
        decode_call(&msg),
        Envelope::Denied {
            xid: XID,
            why: Denial::Auth(AuthError::BadCred)
        }
    );
}

#[test]
fn the_dispatcher_counts_calls_and_rejections() {
    let d = dispatcher();
    let _ = d.handle(&call_msg(1, 2, TEST_PROG, 2, 0, (0, &[]), &[]), None);
    let _ = d.handle(
        &call_msg(2, 2, TEST_PROG, 2, 1, (0, &[]), &words(&[1])),
        None,
    );
    let _ = d.handle(
        &call_msg(3, 2, TEST_PROG, 2, 1, (0, &[]), &words(&[1])),
        None,
    );
    let _ = d.handle(&call_msg(4, 2, 1, 2, 1, (0, &[]), &[]), None);
    let _ = d.handle(&[0; 5], None);
    assert_eq!(
        d.calls(),
        vec![(TEST_PROG, "NULL", 1), (TEST_PROG, "ECHO", 2)]
    );
    assert_eq!(d.rejected(), 1);
    assert_eq!(d.dropped(), 1);
    // Every call that ran was timed.
    let timed: Vec<_> = d
        .procedures()
        .into_iter()
        .map(|p| {
            assert!(p.p50 <= p.p99, "{p:?}");
            (p.program, p.name, p.calls)
        })
        .collect();
    assert_eq!(timed, d.calls());
}

#[test]
fn a_panicking_procedure_is_answered_system_err() {
    let msg = call_msg(XID, 2, TEST_PROG, 2, 3, (0, &[]), &[]);
    assert_eq!(reply_to(&msg), Some(words(&[&ACCEPTED[..], &[5]].concat())));
}
