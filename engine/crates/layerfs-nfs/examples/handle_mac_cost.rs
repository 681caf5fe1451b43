//! What signing and checking a file handle costs: BLAKE3 keyed over the
//! 25 bytes a handle names a file by, truncated to 16.
//!
//!     cargo run --release -p layerfs-nfs --example handle_mac_cost

use std::hint::black_box;
use std::time::Instant;

use layerfs_nfs::{FileHandle, HandleKey};

fn main() {
    let key = HandleKey::random().unwrap();
    let n = 1_000_000u64;
    for round in 0..3 {
        let start = Instant::now();
        let mut sum = 0u64;
        for i in 0..n {
            let h = FileHandle {
                export: 7,
                fileid: i,
                generation: 1,
            };
            sum = sum.wrapping_add(black_box(h.bytes(&key))[30] as u64);
        }
        let sign = start.elapsed().as_nanos() as f64 / n as f64;
        let bytes = FileHandle {
            export: 7,
            fileid: 42,
            generation: 1,
        }
        .bytes(&key);
        let start = Instant::now();
        for _ in 0..n {
            sum = sum.wrapping_add(
                FileHandle::decode(black_box(&bytes), 7, &key)
                    .unwrap()
                    .fileid,
            );
        }
        let check = start.elapsed().as_nanos() as f64 / n as f64;
        println!("round {round}: sign {sign:.0} ns, check {check:.0} ns per handle ({sum})");
    }
}
