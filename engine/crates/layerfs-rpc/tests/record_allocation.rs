//! A hostile record mark allocates nothing near the size it claims, and a
//! kernel client's credential nothing at all. This test binary installs an
//! allocator that remembers the largest request per thread.

mod support;

use std::io::ErrorKind;

use layerfs_rpc::envelope::{decode_call, Envelope};
use layerfs_rpc::{Credentials, Records, RECORD_LIMIT};
use layerfs_testkit::{largest_allocation_while, LargestPerThread};
use support::{auth_sys, body, call_msg, fragments, Script, TEST_PROG};

#[global_allocator]
static ALLOCATOR: LargestPerThread = LargestPerThread;

#[test]
fn a_2_gib_mark_allocates_nothing_for_its_claim() {
    let mut stream = (0x8000_0000u32 | 0x7FFF_FFFF).to_be_bytes().to_vec();
    stream.extend_from_slice(&[0; 64]);
    let largest = largest_allocation_while(|| {
        let mut records = Records::new(Script::whole(stream));
        assert_eq!(
            records.next_record().unwrap_err().kind(),
            ErrorKind::InvalidData
        );
    });
    assert!(largest <= 64 * 1024, "largest allocation {largest} bytes");
}

#[test]
fn a_chain_past_the_limit_stops_before_allocating_its_next_fragment() {
    let first = body(RECORD_LIMIT - 100, 1);
    let second = body(200, 2);
    let stream = fragments(&[&first, &second]);
    let largest = largest_allocation_while(|| {
        let mut records = Records::new(Script::whole(stream));
        assert_eq!(
            records.next_record().unwrap_err().kind(),
            ErrorKind::InvalidData
        );
    });
    // The first fragment's buffer is allowed; nothing more.
    assert!(
        largest <= RECORD_LIMIT,
        "largest allocation {largest} bytes"
    );
}

#[test]
fn an_auth_sys_credential_with_every_group_decodes_without_allocating() {
    let groups: Vec<u32> = (1000..1016).collect();
    let cred = auth_sys(b"build-host.example.org", 1000, 1000, &groups);
    let msg = call_msg(1, 2, TEST_PROG, 3, 1, (1, &cred), &[]);
    let mut decoded = None;
    let largest = largest_allocation_while(|| decoded = Some(decode_call(&msg)));
    let Some(Envelope::Call(header)) = decoded else {
        panic!("not a call")
    };
    let Credentials::Sys(sys) = header.cred else {
        panic!("not AUTH_SYS")
    };
    assert_eq!((sys.uid, sys.gids.as_slice()), (1000, groups.as_slice()));
    assert_eq!(largest, 0, "largest allocation {largest} bytes");
}
