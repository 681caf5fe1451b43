//! Who sent a FUSE request: its uid and gid come with it; its supplementary
//! groups only from `/proc/PID/status`, which costs an open and a read, so
//! they are kept per process for a moment.

use layerfs_vfs::bounded::BoundedMap;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

use layerfs_vfs::{Caller, Groups};

/// A process's groups are read again after this long: a process that drops
/// or gains a group is seen with its new groups within it.
const KEEP: Duration = Duration::from_secs(1);
/// Processes remembered at most; past it the table starts over.
const MOST: usize = 4096;

pub struct Callers {
    known: Mutex<BoundedMap<u32, Known>>,
}

impl Default for Callers {
    fn default() -> Self {
        Callers {
            known: Mutex::new(BoundedMap::new(MOST)),
        }
    }
}

struct Known {
    uid: u32,
    gid: u32,
    gids: Groups,
    at: Instant,
}

impl Callers {
    pub fn caller(&self, uid: u32, gid: u32, pid: u32) -> Caller {
        // Root passes every check whatever its groups; a request the kernel
        // makes itself has pid 0 and no process to ask.
        if uid == 0 || pid == 0 {
            return Caller {
                uid,
                gid,
                gids: Groups::new(),
            };
        }
        let now = Instant::now();
        {
            let known = self.known.lock();
            if let Some(k) = known.get(&pid) {
                if k.uid == uid && k.gid == gid && now.duration_since(k.at) < KEEP {
                    return Caller {
                        uid,
                        gid,
                        gids: k.gids.clone(),
                    };
                }
            }
        }
        let gids: Groups = groups_of(pid).unwrap_or_default().into();
        self.known.lock().insert(
            pid,
            Known {
                uid,
                gid,
                gids: gids.clone(),
                at: now,
            },
        );
        Caller { uid, gid, gids }
    }
}

/// The supplementary groups of a process; `None` if it is gone.
fn groups_of(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(parse_groups(&status))
}

fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_come_from_the_status_line() {
        let status = "Name:\tcat\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 27 1000 \nNgid:\t0\n";
        assert_eq!(parse_groups(status), vec![4, 27, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
    }

    #[test]
    fn this_process_is_read_with_its_own_groups() {
        let mine = rustix::process::getgroups().unwrap();
        let pid = std::process::id();
        let callers = Callers::default();
        let c = callers.caller(4242, 4343, pid);
        let mut got = c.gids.to_vec();
        let mut want: Vec<u32> = mine.iter().map(|g| g.as_raw()).collect();
        got.sort();
        want.sort();
        want.dedup();
        assert_eq!(got, want);
        assert_eq!((c.uid, c.gid), (4242, 4343));
        assert!(callers.caller(0, 0, pid).gids.is_empty());
    }
}
