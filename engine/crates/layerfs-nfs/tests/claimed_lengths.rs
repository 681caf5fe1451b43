//! A length inside a call's arguments that claims more than the record
//! holds is GARBAGE_ARGS, and nothing is allocated for it: before this was
//! checked, one LINK call of 6 fuzzed bytes had the server allocate 4 GiB
//! (`fuzz/fuzz_targets/nfs_calls.rs`). Every procedure and MOUNT's path.

use std::net::IpAddr;
use std::sync::Arc;

mod support;

use layerfs_rpc::{Dispatcher, Outcome};
use layerfs_testkit::{largest_allocation_while, LargestPerThread};
use layerfs_vfs::LocalFs;
use support::{call_record, xdr_opaque};

#[global_allocator]
static ALLOC: LargestPerThread = LargestPerThread;

/// The reply's accept_stat (after xid, REPLY, MSG_ACCEPTED, verifier).
fn accept_stat(d: &Dispatcher, record: &[u8]) -> u32 {
    let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
    let Outcome::Reply(reply) = d.handle(record, peer) else {
        panic!("dropped")
    };
    u32::from_be_bytes(reply.bytes()[4 + 20..4 + 24].try_into().unwrap())
}

#[test]
fn lengths_past_the_record_are_garbage_and_allocate_nothing() {
    let export = tempfile::tempdir().unwrap();
    let fs = Arc::new(LocalFs::open(export.path()).unwrap());
    let d = Dispatcher::new(layerfs_nfs::programs(fs, b"/").unwrap());
    let root = {
        let peer: Option<IpAddr> = Some("127.0.0.1".parse().unwrap());
        let Outcome::Reply(r) = d.handle(&call_record(1, 100_005, 1, &xdr_opaque(b"/")), peer)
        else {
            panic!("MNT")
        };
        let len = layerfs_nfs::FileHandle::LEN;
        r.bytes()[4 + 24 + 8..4 + 24 + 8 + len].to_vec()
    };
    let huge = u32::MAX.to_be_bytes();
    let mut cases: Vec<(u32, u32, Vec<u8>)> = Vec::new();
    for proc in 1..=21 {
        // The first handle claims 4 GiB.
        cases.push((100_003, proc, [&huge[..], b"abcd"].concat()));
        // A real handle, then a name that claims 4 GiB.
        cases.push((
            100_003,
            proc,
            [xdr_opaque(&root), huge.to_vec(), b"ab".to_vec()].concat(),
        ));
    }
    cases.push((100_005, 1, [&huge[..], b"/"].concat()));
    cases.push((100_005, 3, [&huge[..], b"/"].concat()));
    for (xid, (prog, proc, args)) in cases.into_iter().enumerate() {
        let record = call_record(xid as u32 + 10, prog, proc, &args);
        let mut stat = 0;
        let largest = largest_allocation_while(|| stat = accept_stat(&d, &record));
        assert!(
            largest < 1024 * 1024,
            "program {prog} procedure {proc}: allocated {largest} bytes"
        );
        // GARBAGE_ARGS (4), or a whole status reply (SUCCESS, 0) where the
        // claimed length is not in a field with a length (READ's count).
        assert!(
            matches!(stat, 0 | 4),
            "program {prog} procedure {proc}: {stat}"
        );
    }
}
