//! What keying the reply cache on every argument byte costs: the hash of a
//! 1 MiB WRITE payload with xxh3 (what the cache uses) next to FNV-1a byte
//! by byte.
//!
//!     cargo run --release -p layerfs-nfs --example reply_cache_hash

use std::hint::black_box;
use std::time::Instant;
use twox_hash::XxHash3_64;

fn main() {
    let data = vec![7u8; 1 << 20];
    let rounds = 2000u32;
    for i in 0..200u64 {
        black_box(XxHash3_64::oneshot_with_seed(i, &data));
    }
    let start = Instant::now();
    for i in 0..rounds {
        black_box(XxHash3_64::oneshot_with_seed(
            u64::from(i),
            black_box(&data),
        ));
    }
    let xxh3 = start.elapsed() / rounds;
    let start = Instant::now();
    for _ in 0..20 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in black_box(&data) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        black_box(h);
    }
    let fnv = start.elapsed() / 20;
    println!("1 MiB of arguments: xxh3 {xxh3:?}, FNV-1a byte by byte {fnv:?}");
}
