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
//! second would be answered without running. xxh3 hashes a 1 MiB WRITE in
//! about 39 us here, FNV-1a byte by byte in 1.1 ms (`examples/reply_cache_hash.rs`).
//! Bounded: the oldest entries are evicted first; lookups are O(1).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use layerfs_rpc::{Call, Credentials};
/// How long a retransmission waits for the original call still running.
const IN_PROGRESS_WAIT: Duration = Duration::from_secs(30);

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
            checksum: xxhash_rust::xxh3::xxh3_64_with_seed(call.args, u64::from(prog)),
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
    finished: Condvar,
    capacity: usize,
}

impl ReplyCache {
    pub fn new(capacity: usize) -> Self {
        ReplyCache {
            entries: Mutex::new(Entries {
                slots: HashMap::new(),
                order: VecDeque::new(),
            }),
            finished: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    /// The cached results for `key`, waiting if the original is still
    /// running; `None` means the caller runs the call and must then
    /// [`finish`](Self::finish) or [`abandon`](Self::abandon) it.
    pub fn begin(&self, key: &Key) -> Option<Vec<u8>> {
        let mut entries = self.entries.lock().expect("reply cache poisoned");
        loop {
            match entries.slots.get(key) {
                Some(Slot::Done(results)) => return Some(results.clone()),
                Some(Slot::Running) => {
                    let (guard, timeout) = self
                        .finished
                        .wait_timeout(entries, IN_PROGRESS_WAIT)
                        .expect("reply cache poisoned");
                    entries = guard;
                    if timeout.timed_out() {
                        return None;
                    }
                }
                None => break,
            }
        }
        entries.slots.insert(key.clone(), Slot::Running);
        entries.order.push_back(key.clone());
        while entries.order.len() > self.capacity {
            let Some(old) = entries.order.pop_front() else {
                break;
            };
            entries.slots.remove(&old);
        }
        None
    }

    pub fn finish(&self, key: Key, results: Vec<u8>) {
        let mut entries = self.entries.lock().expect("reply cache poisoned");
        if let Some(slot) = entries.slots.get_mut(&key) {
            *slot = Slot::Done(results);
        }
        drop(entries);
        self.finished.notify_all();
    }

    /// Forgets a call that produced no reply worth replaying.
    pub fn abandon(&self, key: Key) {
        let mut entries = self.entries.lock().expect("reply cache poisoned");
        entries.slots.remove(&key);
        entries.order.retain(|k| *k != key);
        drop(entries);
        self.finished.notify_all();
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
        assert_eq!(cache.begin(&key), None);
        cache.finish(key.clone(), b"results".to_vec());
        // The key has no port: a reconnect from a new one still matches.
        let again = Key::of(100_003, &call(1, "127.0.0.1", b"args", &cred));
        assert_eq!(cache.begin(&again), Some(b"results".to_vec()));
    }

    #[test]
    fn other_xids_arguments_and_clients_miss() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let key = Key::of(100_003, &call(1, "127.0.0.1", b"args", &cred));
        cache.begin(&key);
        cache.finish(key, b"r".to_vec());
        for other in [
            call(2, "127.0.0.1", b"args", &cred),
            call(1, "127.0.0.2", b"args", &cred),
            call(1, "127.0.0.1", b"argz", &cred),
        ] {
            assert_eq!(cache.begin(&Key::of(100_003, &other)), None);
        }
    }

    #[test]
    fn calls_alike_but_for_bytes_past_the_first_256_miss() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let mut args = vec![7u8; 4096];
        let key = Key::of(100_003, &call(1, "127.0.0.1", &args, &cred));
        cache.begin(&key);
        cache.finish(key, b"r".to_vec());
        for at in [300, 4095] {
            args[at] ^= 1;
            let other = Key::of(100_003, &call(1, "127.0.0.1", &args, &cred));
            assert_eq!(cache.begin(&other), None, "byte {at} differs");
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
            cache.begin(k);
            cache.finish(k.clone(), vec![1]);
        }
        assert_eq!(cache.begin(&keys[0]), None, "evicted");
        assert_eq!(cache.begin(&keys[2]), Some(vec![1]));
    }
}
