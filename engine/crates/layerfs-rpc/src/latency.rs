//! How long procedures take to run: one lock-free histogram per procedure,
//! in power-of-two microsecond buckets, so timing a call costs two clock
//! reads and one relaxed add, and p50/p99 come out within a factor of two.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Buckets: 0 holds calls under 1 us; bucket `i` calls of [2^(i-1), 2^i) us;
/// the last everything from about 17 minutes up.
pub const BUCKETS: usize = 32;

#[derive(Default)]
pub struct Latency {
    buckets: [AtomicU64; BUCKETS],
}

impl Latency {
    pub fn record(&self, took: Duration) {
        let us = took.as_micros().min(u128::from(u64::MAX)) as u64;
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        self.buckets[bucket.min(BUCKETS - 1)].fetch_add(1, Relaxed);
    }

    pub fn counts(&self) -> [u64; BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Relaxed))
    }
}

/// The upper bound of the bucket that holds the `q`-quantile call (`q` in
/// 0..=1); `None` without calls.
pub fn quantile(counts: &[u64; BUCKETS], q: f64) -> Option<Duration> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(Duration::from_micros(1u64 << i));
        }
    }
    unreachable!("the ranks add up to the total")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_the_buckets() {
        let l = Latency::default();
        assert_eq!(quantile(&l.counts(), 0.5), None);
        for _ in 0..98 {
            l.record(Duration::from_micros(20)); // [16, 32)
        }
        l.record(Duration::from_micros(700)); // [512, 1024)
        l.record(Duration::from_secs(3)); // [2^21, 2^22) us
        let counts = l.counts();
        assert_eq!(counts.iter().sum::<u64>(), 100);
        assert_eq!(quantile(&counts, 0.5), Some(Duration::from_micros(32)));
        assert_eq!(quantile(&counts, 0.98), Some(Duration::from_micros(32)));
        assert_eq!(quantile(&counts, 0.99), Some(Duration::from_micros(1024)));
        assert_eq!(quantile(&counts, 1.0), Some(Duration::from_micros(1 << 22)));
    }

    #[test]
    fn the_ends_land_in_the_first_and_last_buckets() {
        let l = Latency::default();
        l.record(Duration::from_nanos(300));
        l.record(Duration::MAX);
        let counts = l.counts();
        assert_eq!((counts[0], counts[BUCKETS - 1]), (1, 1));
    }
}
