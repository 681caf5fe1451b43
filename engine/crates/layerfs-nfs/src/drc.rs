//! The duplicate request cache: a retransmitted call that changes something
//! gets the original reply instead of running twice (a second REMOVE would
//! answer NOENT for a file the first one removed).
//!
//! Keyed on the client's address without the port (clients retransmit after
//! reconnecting from a new port), the xid, the procedure, the caller's uid
//! and gid, and the whole arguments: their length and a hash of every byte.
//! The Linux server checksums only the first 256 bytes; on loopback every
//! client process shares one address and xids coincide, so two WRITEs of
//! different data at the same offset of one file would match there and the
//! second would be answered without running. xxh3, with the widest vector
//! instructions the CPU has (chosen at run time: AVX2 on x86-64), hashes a
//! 1 MiB WRITE in about 45 us here, FNV-1a byte by byte in 1.1 ms
//! (`examples/reply_cache_hash.rs`).
//! Bounded: the oldest entries are evicted first; lookups are O(1).
//! A retransmission of a call still running is dropped without a reply, as
//! knfsd does (it used to park a worker until the call finished); a call
//! that is refused or panics leaves no entry behind.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use twox_hash::XxHash3_64;

use layerfs_rpc::{Call, Credentials};

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Key {
    peer: Option<IpAddr>,
    xid: u32,
    vers: u32,
    proc: u32,
    /// The caller's uid and gid (AUTH_SYS), not its stamp, which the Linux
    /// client renews on a retransmission.
    caller: Option<(u32, u32)>,
    args_len: usize,
    checksum: u64,
}

impl Key {
    pub fn of(prog: u32, call: &Call<'_>) -> Key {
        let caller = match call.cred {
            Credentials::Sys(sys) => Some((sys.uid, sys.gid)),
            Credentials::None => None,
        };
        Key {
            peer: call.peer,
            xid: call.xid,
            vers: call.vers,
            proc: call.proc,
            caller,
            args_len: call.args.len(),
            checksum: XxHash3_64::oneshot_with_seed(u64::from(prog), call.args),
        }
    }
}

enum Slot {
    Running,
    Done(Vec<u8>),
}

struct Entries {
    slots: HashMap<Key, Slot>,
    order: VecDeque<Key>,
}

pub struct ReplyCache {
    entries: Mutex<Entries>,
    capacity: usize,
}

/// What to do with a call that changes something.
#[derive(Debug)]
pub enum Begun<'a> {
    /// A retransmission of a finished call: send these results again.
    Replay(Vec<u8>),
    /// A retransmission of a call still running: answer nothing (as knfsd
    /// does); the client retransmits again and then finds the results.
    InProgress,
    /// A new call: run it and [`Running::finish`] with its results.
    Run(Running<'a>),
}

/// A call being run. Dropped without [`finish`](Running::finish) (the call
/// was refused, or panicked), its entry goes, so a retransmission runs it
/// afresh instead of waiting for results that never come.
pub struct Running<'a> {
    cache: &'a ReplyCache,
    key: Option<Key>,
}

impl std::fmt::Debug for Running<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("key", &self.key).finish()
    }
}

impl Running<'_> {
    pub fn finish(mut self, results: Vec<u8>) {
        let key = self.key.take().expect("finished once");
        let mut entries = self.cache.lock();
        if let Some(slot) = entries.slots.get_mut(&key) {
            *slot = Slot::Done(results);
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut entries = self.cache.lock();
            entries.slots.remove(&key);
            entries.order.retain(|k| *k != key);
        }
    }
}

impl ReplyCache {
    pub fn new(capacity: usize) -> Self {
        ReplyCache {
            entries: Mutex::new(Entries {
                slots: HashMap::new(),
                order: VecDeque::new(),
            }),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Entries> {
        self.entries.lock()
    }

    pub fn begin(&self, key: &Key) -> Begun<'_> {
        let mut entries = self.lock();
        match entries.slots.get(key) {
            Some(Slot::Done(results)) => return Begun::Replay(results.clone()),
            Some(Slot::Running) => return Begun::InProgress,
            None => {}
        }
        entries.slots.insert(key.clone(), Slot::Running);
        entries.order.push_back(key.clone());
        while entries.order.len() > self.capacity {
            let Some(old) = entries.order.pop_front() else {
                break;
            };
            entries.slots.remove(&old);
        }
        Begun::Run(Running {
            cache: self,
            key: Some(key.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(xid: u32, peer: &str, args: &'a [u8], cred: &'a Credentials) -> Call<'a> {
        Call {
            xid,
            vers: 3,
            proc: 12,
            cred,
            args,
            peer: Some(peer.parse().unwrap()),
        }
    }

    #[test]
    fn a_retransmission_gets_the_first_results_even_from_another_port() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let key = Key::of(100_003, &call(1, "127.0.0.1", b"args", &cred));
        run(&cache, &key, b"results");
        // The key has no port: a reconnect from a new one still matches.
        let again = Key::of(100_003, &call(1, "127.0.0.1", b"args", &cred));
        assert_eq!(replay(&cache, &again), Some(b"results".to_vec()));
    }

    #[test]
    fn other_xids_arguments_and_clients_miss() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let key = Key::of(100_003, &call(1, "127.0.0.1", b"args", &cred));
        run(&cache, &key, b"r");
        for other in [
            call(2, "127.0.0.1", b"args", &cred),
            call(1, "127.0.0.2", b"args", &cred),
            call(1, "127.0.0.1", b"argz", &cred),
        ] {
            assert!(matches!(
                cache.begin(&Key::of(100_003, &other)),
                Begun::Run(_)
            ));
        }
    }

    #[test]
    fn calls_alike_but_for_bytes_past_the_first_256_miss() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let mut args = vec![7u8; 4096];
        let key = Key::of(100_003, &call(1, "127.0.0.1", &args, &cred));
        run(&cache, &key, b"r");
        for at in [300, 4095] {
            args[at] ^= 1;
            let other = Key::of(100_003, &call(1, "127.0.0.1", &args, &cred));
            assert_eq!(replay(&cache, &other), None, "byte {at} differs");
            args[at] ^= 1;
        }
    }

    #[test]
    fn the_oldest_entries_are_evicted() {
        let cache = ReplyCache::new(2);
        let cred = Credentials::None;
        let keys: Vec<Key> = (0..3)
            .map(|x| Key::of(1, &call(x, "127.0.0.1", b"a", &cred)))
            .collect();
        for k in &keys {
            run(&cache, k, &[1]);
        }
        assert_eq!(replay(&cache, &keys[0]), None, "evicted");
        assert_eq!(replay(&cache, &keys[2]), Some(vec![1]));
    }

    #[test]
    fn a_retransmission_of_a_running_call_is_dropped_and_a_failed_one_runs_again() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let key = Key::of(100_003, &call(1, "127.0.0.1", b"args", &cred));
        let Begun::Run(running) = cache.begin(&key) else {
            panic!("a new call runs");
        };
        assert!(matches!(cache.begin(&key), Begun::InProgress));
        // The call panics (or is refused): its entry goes with it.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _running = running;
            panic!("a procedure's bug");
        }));
        assert!(unwound.is_err());
        assert!(matches!(cache.begin(&key), Begun::Run(_)), "runs afresh");
    }

    fn run(cache: &ReplyCache, key: &Key, results: &[u8]) {
        match cache.begin(key) {
            Begun::Run(running) => running.finish(results.to_vec()),
            other => panic!("expected to run: {other:?}"),
        }
    }

    /// The results a retransmission gets; `None` if it would run.
    fn replay(cache: &ReplyCache, key: &Key) -> Option<Vec<u8>> {
        match cache.begin(key) {
            Begun::Replay(results) => Some(results),
            _ => None,
        }
    }
}
