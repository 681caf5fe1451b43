//! The duplicate request cache: a retransmitted call that changes something
//! gets the original reply instead of running twice (a second REMOVE would
//! answer NOENT for a file the first one removed).
//!
//! Keyed on the client's address without the port (clients retransmit after
//! reconnecting from a new port), the xid, the procedure, the caller's uid
//! and gid, the file the call's first handle names (as its one decode
//! found it), and the whole arguments: their length and a hash of every
//! byte.
//! The Linux server checksums only the first 256 bytes; on loopback every
//! client process shares one address and xids coincide, so two WRITEs of
//! different data at the same offset of one file would match there and the
//! second would be answered without running. xxh3, with the widest vector
//! instructions the CPU has (chosen at run time: AVX2 on x86-64), hashes a
//! 1 MiB WRITE in about 45 us here, FNV-1a byte by byte in 1.1 ms
//! (`examples/reply_cache_hash.rs`).
//! Arguments of [`HASHED_AFTER_REPLY`] bytes or more (a large WRITE) are
//! hashed after the reply has left, not before the call runs, when no other
//! entry shares everything else of the key: the client need not wait for the
//! hash. Until then a call that shares the rest of the key runs as a call
//! of its own: in practice only a WRITE has arguments that long, another
//! client's WRITE whose xid and length coincide must not wait for a
//! retransmission timeout, and a retransmission run again writes the same
//! bytes at the same offset.
//! Bounded: the oldest entries are evicted first; lookups are O(1).
//! A retransmission of a call still running is dropped without a reply, as
//! knfsd does (it used to park a worker until the call finished); a call
//! that is refused or panics leaves no entry behind.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use twox_hash::XxHash3_64;

use layerfs_rpc::{Call, Credentials};
use layerfs_vfs::FileId;

use crate::handle::FileHandle;

/// Arguments at least this long are hashed after the reply has left: the
/// hash of 64 KiB takes a few microseconds, of 1 MiB about 45.
const HASHED_AFTER_REPLY: usize = 64 * 1024;

/// Everything that identifies a call but the hash of its arguments.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    peer: Option<IpAddr>,
    xid: u32,
    vers: u32,
    proc: u32,
    /// The caller's uid and gid (AUTH_SYS), not its stamp, which the Linux
    /// client renews on a retransmission.
    caller: Option<(u32, u32)>,
    /// The export and file of the call's first handle, when it checked:
    /// calls on other files never share an entry, whatever their bytes.
    file: Option<(u64, FileId)>,
    args_len: usize,
}

impl Key {
    fn of(call: &Call<'_>, file: Option<FileHandle>) -> Key {
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
            file: file.map(|f| (f.export, f.fileid)),
            args_len: call.args.len(),
        }
    }
}

/// The hash of every argument byte, seeded with the program number.
fn checksum(prog: u32, call: &Call<'_>) -> u64 {
    XxHash3_64::oneshot_with_seed(u64::from(prog), call.args)
}

enum Slot {
    Running,
    Done(Vec<u8>),
}

struct Entry {
    /// Tells this entry from others of the same key in `order`.
    id: u64,
    /// `None` until its arguments are hashed after the reply.
    checksum: Option<u64>,
    slot: Slot,
}

struct Entries {
    /// Calls alike but for their arguments' bytes: nearly always one.
    calls: HashMap<Key, Vec<Entry>>,
    order: VecDeque<(Key, u64)>,
    next_id: u64,
}

impl Entries {
    fn entry_mut(&mut self, key: &Key, id: u64) -> Option<&mut Entry> {
        self.calls.get_mut(key)?.iter_mut().find(|e| e.id == id)
    }

    fn remove(&mut self, key: &Key, id: u64) {
        if let Some(alike) = self.calls.get_mut(key) {
            alike.retain(|e| e.id != id);
            if alike.is_empty() {
                self.calls.remove(key);
            }
        }
    }

    /// Adds a running call and evicts the oldest past `capacity`.
    fn insert(&mut self, key: Key, checksum: Option<u64>, capacity: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.calls.entry(key.clone()).or_default().push(Entry {
            id,
            checksum,
            slot: Slot::Running,
        });
        self.order.push_back((key, id));
        while self.order.len() > capacity {
            let Some((old, old_id)) = self.order.pop_front() else {
                break;
            };
            self.remove(&old, old_id);
        }
        id
    }
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
    id: u64,
    hashed: bool,
}

impl std::fmt::Debug for Running<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("key", &self.key)
            .field("hashed", &self.hashed)
            .finish()
    }
}

impl Running<'_> {
    /// Keeps the call's results for its retransmissions. `true` if its
    /// arguments are still to be hashed, with [`ReplyCache::hash_after_reply`]
    /// once the reply has left.
    pub fn finish(mut self, results: Vec<u8>) -> bool {
        let key = self.key.take().expect("finished once");
        let mut entries = self.cache.entries.lock();
        if let Some(entry) = entries.entry_mut(&key, self.id) {
            entry.slot = Slot::Done(results);
        }
        !self.hashed
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut entries = self.cache.entries.lock();
            entries.remove(&key, self.id);
            let id = self.id;
            entries.order.retain(|(_, i)| *i != id);
        }
    }
}

impl ReplyCache {
    pub fn new(capacity: usize) -> Self {
        ReplyCache {
            entries: Mutex::new(Entries {
                calls: HashMap::new(),
                order: VecDeque::new(),
                next_id: 0,
            }),
            capacity: capacity.max(1),
        }
    }

    /// Looks the call of program `prog` on `file` up: a retransmission, or
    /// a call to run.
    pub fn begin(&self, prog: u32, call: &Call<'_>, file: Option<FileHandle>) -> Begun<'_> {
        let key = Key::of(call, file);
        if call.args.len() >= HASHED_AFTER_REPLY {
            let mut entries = self.entries.lock();
            if !entries.calls.contains_key(&key) {
                let id = entries.insert(key.clone(), None, self.capacity);
                return self.running(key, id, false);
            }
        }
        // Hashed without the lock: other connections' calls go on meanwhile.
        let sum = checksum(prog, call);
        let mut entries = self.entries.lock();
        // One not yet hashed matches nothing (see the module's documentation).
        if let Some(alike) = entries.calls.get(&key) {
            match alike.iter().find(|e| e.checksum == Some(sum)) {
                Some(Entry {
                    slot: Slot::Done(results),
                    ..
                }) => return Begun::Replay(results.clone()),
                Some(_) => return Begun::InProgress,
                None => {}
            }
        }
        let id = entries.insert(key.clone(), Some(sum), self.capacity);
        self.running(key, id, true)
    }

    fn running(&self, key: Key, id: u64, hashed: bool) -> Begun<'_> {
        Begun::Run(Running {
            cache: self,
            key: Some(key),
            id,
            hashed,
        })
    }

    /// Hashes the arguments of a call whose [`Running::finish`] said they
    /// were still to be, once its reply has left.
    pub fn hash_after_reply(&self, prog: u32, call: &Call<'_>, file: Option<FileHandle>) {
        let key = Key::of(call, file);
        let sum = checksum(prog, call);
        let mut entries = self.entries.lock();
        // Only one entry of a key can be unhashed: it was made alone.
        if let Some(alike) = entries.calls.get_mut(&key) {
            if let Some(entry) = alike.iter_mut().find(|e| e.checksum.is_none()) {
                entry.checksum = Some(sum);
            }
        }
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
        run(&cache, &call(1, "127.0.0.1", b"args", &cred), b"results");
        // The key has no port: a reconnect from a new one still matches.
        let again = call(1, "127.0.0.1", b"args", &cred);
        assert_eq!(replay(&cache, &again), Some(b"results".to_vec()));
    }

    #[test]
    fn other_xids_arguments_and_clients_miss() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        run(&cache, &call(1, "127.0.0.1", b"args", &cred), b"r");
        for other in [
            call(2, "127.0.0.1", b"args", &cred),
            call(1, "127.0.0.2", b"args", &cred),
            call(1, "127.0.0.1", b"argz", &cred),
        ] {
            assert!(matches!(cache.begin(NFS, &other, None), Begun::Run(_)));
        }
    }

    #[test]
    fn calls_alike_but_for_bytes_past_the_first_256_miss() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let mut args = vec![7u8; 4096];
        run(&cache, &call(1, "127.0.0.1", &args, &cred), b"r");
        for at in [300, 4095] {
            args[at] ^= 1;
            let other = call(1, "127.0.0.1", &args, &cred);
            assert_eq!(replay(&cache, &other), None, "byte {at} differs");
            args[at] ^= 1;
        }
    }

    #[test]
    fn the_oldest_entries_are_evicted() {
        let cache = ReplyCache::new(2);
        let cred = Credentials::None;
        let calls: Vec<Call<'_>> = (0..3).map(|x| call(x, "127.0.0.1", b"a", &cred)).collect();
        for c in &calls {
            run(&cache, c, &[1]);
        }
        assert_eq!(replay(&cache, &calls[0]), None, "evicted");
        assert_eq!(replay(&cache, &calls[2]), Some(vec![1]));
    }

    #[test]
    fn a_retransmission_of_a_running_call_is_dropped_and_a_failed_one_runs_again() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let first = call(1, "127.0.0.1", b"args", &cred);
        let running = runs(&cache, &first);
        assert!(matches!(cache.begin(NFS, &first, None), Begun::InProgress));
        // The call panics (or is refused): its entry goes with it.
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _running = running;
            panic!("a procedure's bug");
        }));
        assert!(unwound.is_err());
        assert!(
            matches!(cache.begin(NFS, &first, None), Begun::Run(_)),
            "runs afresh"
        );
    }

    #[test]
    fn a_large_call_is_hashed_after_its_reply_and_then_told_from_one_alike() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let args = vec![7u8; HASHED_AFTER_REPLY];
        let first = call(1, "127.0.0.1", &args, &cred);
        let later = runs(&cache, &first).finish(b"r".to_vec());
        assert!(later, "to be hashed after the reply");
        // Before the hash nothing tells a retransmission from a call alike:
        // it runs, as a call of its own, hashed before it runs.
        let later = runs(&cache, &first).finish(b"r".to_vec());
        assert!(!later);
        cache.hash_after_reply(NFS, &first, None);
        assert_eq!(replay(&cache, &first), Some(b"r".to_vec()));

        let mut other = args.clone();
        other[HASHED_AFTER_REPLY - 1] ^= 1;
        let alike = call(1, "127.0.0.1", &other, &cred);
        let later = runs(&cache, &alike).finish(b"s".to_vec());
        assert!(
            !later,
            "other bytes: a call of its own, hashed before it ran"
        );
        assert_eq!(replay(&cache, &alike), Some(b"s".to_vec()));
        assert_eq!(replay(&cache, &first), Some(b"r".to_vec()));
    }

    #[test]
    fn a_large_call_refused_before_its_hash_leaves_nothing_behind() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let args = vec![7u8; HASHED_AFTER_REPLY];
        let first = call(1, "127.0.0.1", &args, &cred);
        drop(runs(&cache, &first));
        assert!(
            matches!(cache.begin(NFS, &first, None), Begun::Run(_)),
            "runs afresh"
        );
    }

    #[test]
    fn calls_on_other_files_never_share_an_entry() {
        let cache = ReplyCache::new(8);
        let cred = Credentials::None;
        let file = |fileid| {
            Some(FileHandle {
                export: 1,
                fileid,
                generation: 0,
            })
        };
        let args = vec![7u8; HASHED_AFTER_REPLY];
        let first = call(1, "127.0.0.1", &args, &cred);
        let Begun::Run(running) = cache.begin(NFS, &first, file(10)) else {
            panic!("a new call")
        };
        assert!(running.finish(b"r".to_vec()), "hashed after its reply");
        // Another file's WRITE whose xid and length coincide (the bytes
        // are kept alike here): it runs, and it too is hashed only after
        // its reply; keyed on the bytes alone, it would wait for its hash.
        let Begun::Run(running) = cache.begin(NFS, &first, file(11)) else {
            panic!("another file's call ran as a retransmission")
        };
        assert!(running.finish(b"s".to_vec()), "hashed after its reply");
        cache.hash_after_reply(NFS, &first, file(10));
        cache.hash_after_reply(NFS, &first, file(11));
        for (fileid, results) in [(10, b"r"), (11, b"s")] {
            match cache.begin(NFS, &first, file(fileid)) {
                Begun::Replay(got) => assert_eq!(got, results, "file {fileid}"),
                other => panic!("file {fileid}: {other:?}"),
            }
        }
    }

    const NFS: u32 = 100_003;

    /// The call, begun as a new one.
    fn runs<'c>(cache: &'c ReplyCache, call: &Call<'_>) -> Running<'c> {
        match cache.begin(NFS, call, None) {
            Begun::Run(running) => running,
            other => panic!("expected to run: {other:?}"),
        }
    }

    /// Runs the call to its end, its arguments hashed after its reply.
    fn run(cache: &ReplyCache, call: &Call<'_>, results: &[u8]) {
        if runs(cache, call).finish(results.to_vec()) {
            cache.hash_after_reply(NFS, call, None);
        }
    }

    /// The results a retransmission gets; `None` if it would run.
    fn replay(cache: &ReplyCache, call: &Call<'_>) -> Option<Vec<u8>> {
        match cache.begin(NFS, call, None) {
            Begun::Replay(results) => Some(results),
            _ => None,
        }
    }
}
