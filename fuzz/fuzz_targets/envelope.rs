//! The call envelope of any record: decoded without a panic, and a call's
//! arguments always lie inside the record.
#![no_main]

use layerfs_rpc::envelope::{decode_call, Envelope};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|record: &[u8]| {
    if let Envelope::Call(header) = decode_call(record) {
        assert!(header.args_at <= record.len());
    }
});
