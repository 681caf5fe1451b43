//! FUSE over io_uring (Linux 6.14): each CPU's requests answered on that CPU.
//!
//! Through `/dev/fuse` a request wakes whichever door thread waited longest,
//! wherever it sleeps, and its reply wakes the caller there: on a machine
//! that halts idle CPUs, each of those wake-ups across CPUs costs more than
//! the request itself (docs/benchmarks.md). With FUSE over io_uring the
//! kernel queues a request on the ring of the CPU its caller runs on; a
//! thread kept on that CPU takes it, and the caller is woken from there.
//!
//! One ring per CPU serves every mount of the process: a daemon of hundreds
//! of workspaces runs a thread per CPU (and a reader beside each), not one
//! per CPU per mount. A mount [`join`]s each CPU's ring with [`DEPTH`]
//! slots on its connection's queue for that CPU; every request fetched is
//! answered by [`crate::wire`] with the mount's door, into the slot's own
//! buffers. Large READs go to the CPU's reader thread, kept nowhere, so
//! that the reader's CPU is not the only one copying. When a connection
//! ends (unmounted, aborted), the kernel ends its slots' commands with an
//! error; once none of them is left with the kernel, the mount's slots are
//! dropped and the ring serves the others on.
//!
//! The kernel still sends FORGETs and INTERRUPTs through `/dev/fuse`, where
//! the session that answered FUSE_INIT goes on reading, FORGETs in batches
//! ([`crate::forgets`]).

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use rustix::event::{eventfd, EventfdFlags};

use crate::door::Door;
use crate::wire::Answered;
use slot::Slot;

mod slot;

/// Requests each mount's queue on a CPU holds at once.
const DEPTH: usize = 2;

/// Entries the submission queue holds; more are submitted in turns.
const SUBMISSIONS: u32 = 64;

/// The user data of the wake-up poll; a slot's is its mount's index and
/// its own (see [`tag`]).
const WAKE: u64 = u64::MAX;

/// A mount's connection as one CPU's ring serves it.
struct Joining {
    device: OwnedFd,
    door: Arc<Door>,
    /// Told once the ring's slots for it are with the kernel.
    registered: mpsc::Sender<()>,
}

/// How long [`join`] waits for every ring to have registered a mount.
const REGISTERING: Duration = Duration::from_secs(5);

/// One CPU's ring, as the rest of the process reaches it.
struct Ring {
    joining: mpsc::Sender<Joining>,
    /// Written to wake the ring's thread: a mount joins, a READ is done.
    wake: Arc<OwnedFd>,
}

/// The process's rings, one per CPU, started at the first mount to join.
fn rings() -> io::Result<&'static [Ring]> {
    static RINGS: OnceLock<Vec<Ring>> = OnceLock::new();
    static STARTING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _one_at_a_time = STARTING.lock();
    if let Some(rings) = RINGS.get() {
        return Ok(rings);
    }
    let rings = (0..possible_cpus())
        .map(Ring::start)
        .collect::<io::Result<Vec<_>>>()?;
    Ok(RINGS.get_or_init(|| rings))
}

/// Serves `device`'s connection on every CPU's ring, with doors `door`
/// makes, and returns once each ring has registered its slots. The kernel
/// takes requests to the rings once every CPU's queue has registered;
/// until then, or if one fails, they come through `/dev/fuse`.
pub(crate) fn join(device: &OwnedFd, mut door: impl FnMut() -> Door) -> io::Result<()> {
    let rings = rings()?;
    let (registered, acks) = mpsc::channel();
    for ring in rings {
        let joining = Joining {
            device: device.try_clone()?,
            door: Arc::new(door()),
            registered: registered.clone(),
        };
        ring.joining
            .send(joining)
            .map_err(|_| io::Error::other("a CPU's FUSE ring has ended"))?;
        rustix::io::write(&*ring.wake, &1u64.to_ne_bytes())?;
    }
    for _ in rings {
        acks.recv_timeout(REGISTERING)
            .map_err(|_| io::Error::other("a CPU's FUSE ring did not register the mount"))?;
    }
    Ok(())
}

/// Sends a request of the mount at `mountpoint` from each CPU, in the
/// background. Registering slots does not hand them the requests already
/// waiting in a CPU's queue (those a server that died left there); the
/// answer to one request does, and the next, until the queue is empty.
pub(crate) fn wake_queues(mountpoint: &Path) {
    for cpu in 0..possible_cpus() {
        let path = mountpoint.to_path_buf();
        let woken = on_cpu(cpu, format!("fuse-wake-{cpu}"), move || {
            if let Err(e) = rustix::fs::statfs(&path) {
                tracing::debug!("{}: statfs from CPU {cpu}: {e}", path.display());
            }
        });
        if let Err(e) = woken {
            tracing::warn!(
                "{}: no thread to wake CPU {cpu}'s queue: {e}",
                mountpoint.display()
            );
        }
    }
}

impl Ring {
    fn start(cpu: usize) -> io::Result<Ring> {
        let (joining, inbox) = mpsc::channel();
        let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC)?);
        let reader = Reader::start(cpu, wake.clone())?;
        let woken = wake.clone();
        on_cpu(cpu, format!("fuse-ring-{cpu}"), move || {
            let served = IoUring::builder()
                .build(SUBMISSIONS)
                .and_then(|ring| Served::new(cpu as u16, ring, inbox, woken, reader).serve());
            if let Err(e) = served {
                tracing::error!("FUSE ring of CPU {cpu} ended: {e}");
            }
        })?;
        Ok(Ring { joining, wake })
    }
}

/// A mount's slots on one CPU's ring.
struct Mount {
    device: OwnedFd,
    door: Arc<Door>,
    /// Each slot here, or `None` while the reader thread has it.
    slots: Vec<Option<Box<Slot>>>,
    /// Slots whose command the kernel has not ended.
    live: usize,
    /// Whether a request came through this ring yet.
    served: bool,
}

/// One CPU's ring thread and what it serves.
struct Served {
    qid: u16,
    /// Dropped before `mounts`: the kernel writes requests into their
    /// slots until the ring is gone.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    mounts: Vec<Option<Mount>>,
    inbox: mpsc::Receiver<Joining>,
    wake: Arc<OwnedFd>,
    reader: Reader,
    answered: Answered,
    /// Requests given, logged at each power of ten: what shows that
    /// requests came through the rings, not `/dev/fuse`.
    given: u64,
    next_logged: u64,
}

/// A slot's user data: its mount's index and its own.
fn tag(mount: usize, slot: usize) -> u64 {
    ((mount as u64) << 32) | slot as u64
}

fn untag(data: u64) -> (usize, usize) {
    ((data >> 32) as usize, (data & 0xffff_ffff) as usize)
}

impl Served {
    fn new(
        qid: u16,
        ring: IoUring<squeue::Entry128, cqueue::Entry>,
        inbox: mpsc::Receiver<Joining>,
        wake: Arc<OwnedFd>,
        reader: Reader,
    ) -> Served {
        Served {
            qid,
            ring,
            mounts: Vec::new(),
            inbox,
            wake,
            reader,
            answered: Answered::default(),
            given: 0,
            next_logged: 1,
        }
    }

    fn serve(mut self) -> io::Result<()> {
        self.push(poll(&self.wake))?;
        let mut done: Vec<(u64, i32)> = Vec::new();
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            done.clear();
            done.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(data, result) in &done {
                match data {
                    WAKE => self.woken()?,
                    _ => self.fetched(untag(data), result)?,
                }
            }
        }
    }

    /// Takes in the mounts joining and the READs the reader is done with.
    fn woken(&mut self) -> io::Result<()> {
        let _ = rustix::io::read(&*self.wake, &mut [0u8; 8]);
        while let Ok(joining) = self.inbox.try_recv() {
            let registered = joining.registered.clone();
            self.add(joining)?;
            self.ring.submit()?;
            let _ = registered.send(());
        }
        while let Ok((at, slot)) = self.reader.done.try_recv() {
            self.give_back(at, slot)?;
        }
        self.push(poll(&self.wake))
    }

    fn add(&mut self, joining: Joining) -> io::Result<()> {
        let index = match self.mounts.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.mounts.push(None);
                self.mounts.len() - 1
            }
        };
        let slots: Vec<_> = (0..DEPTH).map(|_| Some(Box::new(Slot::new()))).collect();
        let registers: Vec<_> = slots
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let slot = slot.as_ref().expect("every slot is here");
                slot.register(&joining.device, self.qid)
                    .user_data(tag(index, i))
            })
            .collect();
        self.mounts[index] = Some(Mount {
            device: joining.device,
            door: joining.door,
            slots,
            live: DEPTH,
            served: false,
        });
        for entry in registers {
            self.push(entry)?;
        }
        Ok(())
    }

    /// A slot's command ended: a request fetched into it, or the end of
    /// its mount's connection.
    fn fetched(&mut self, (index, i): (usize, usize), result: i32) -> io::Result<()> {
        let qid = self.qid;
        // A ring serves every mount of its CPU: what goes wrong with one
        // slot is logged, never an end of the ring.
        let Some(mount) = self.mounts.get_mut(index).and_then(Option::as_mut) else {
            tracing::warn!("FUSE ring of CPU {qid}: a completion for no mount");
            return Ok(());
        };
        if result < 0 {
            // ENOTCONN, ECANCELED: the connection ended. Any other error
            // ends the slot too; the mount's other slots serve on.
            if result != -libc::ENOTCONN && result != -libc::ECANCELED {
                let e = io::Error::from_raw_os_error(-result);
                tracing::warn!("a FUSE ring slot of CPU {qid} ended: {e}");
            }
            mount.live -= 1;
            if mount.live == 0 {
                self.mounts[index] = None;
            }
            return Ok(());
        }
        if !mount.served {
            mount.door.rings_serve();
            mount.served = true;
        }
        mount.door.answered_on_ring();
        self.given += 1;
        if self.given == self.next_logged {
            let given = self.given;
            tracing::info!("FUSE ring of CPU {qid} has been given {given} requests");
            self.next_logged = given.saturating_mul(10);
        }
        let Some(mut slot) = mount.slots.get_mut(i).and_then(Option::take) else {
            tracing::warn!("FUSE ring of CPU {qid}: a request in a slot it does not hold");
            return Ok(());
        };
        if slot.is_large_read() {
            let job = ((index, i), slot, mount.door.clone());
            return self
                .reader
                .jobs
                .send(job)
                .map_err(|_| io::Error::other("the reader thread is gone"));
        }
        slot::answer(&mut slot, &mount.door, &mut self.answered);
        self.give_back((index, i), slot)
    }

    /// Commits the answer in `slot`, lending it for the next request.
    fn give_back(&mut self, (index, i): (usize, usize), slot: Box<Slot>) -> io::Result<()> {
        let Some(mount) = self.mounts.get_mut(index).and_then(Option::as_mut) else {
            tracing::warn!("FUSE ring of CPU {}: an answer for no mount", self.qid);
            return Ok(());
        };
        let entry = slot
            .commit(&mount.device, self.qid)
            .user_data(tag(index, i));
        mount.slots[i] = Some(slot);
        self.push(entry)
    }

    fn push(&mut self, entry: squeue::Entry128) -> io::Result<()> {
        loop {
            #[allow(unsafe_code)]
            // SAFETY: every buffer the entry names (a slot's iovecs, header
            // and payload) lives until the kernel has ended its command: a
            // mount's slots are dropped only then, or after the ring.
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }
}

/// The poll that wakes the ring when `wake` is written.
fn poll(wake: &OwnedFd) -> squeue::Entry128 {
    use std::os::fd::AsRawFd;
    let fd = types::Fd(wake.as_raw_fd());
    squeue::Entry128::from(
        opcode::PollAdd::new(fd, libc::POLLIN as u32)
            .build()
            .user_data(WAKE),
    )
}

/// Large READs of one CPU's ring, answered on a thread of their own: a
/// ring's thread stays on its CPU, and a reader there would otherwise wait
/// for each READ to be copied before it copies the last one out, where
/// through `/dev/fuse` another CPU fills the next while it does.
struct Reader {
    jobs: mpsc::Sender<ReadJob>,
    done: mpsc::Receiver<((usize, usize), Box<Slot>)>,
}

/// A READ in a slot (its mount's index and its own), and the door to
/// answer it with.
type ReadJob = ((usize, usize), Box<Slot>, Arc<Door>);

impl Reader {
    /// Starts the reader thread of CPU `cpu`'s ring, which writes `wake`
    /// after each READ.
    fn start(cpu: usize, wake: Arc<OwnedFd>) -> io::Result<Reader> {
        let (jobs, inbox) = mpsc::channel::<ReadJob>();
        let (outbox, done) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("fuse-read-{cpu}"))
            .spawn(move || {
                let mut answered = Answered::default();
                for (at, mut slot, door) in inbox {
                    slot::answer(&mut slot, &door, &mut answered);
                    drop(door);
                    if outbox.send((at, slot)).is_err() {
                        return;
                    }
                    let _ = rustix::io::write(&*wake, &1u64.to_ne_bytes());
                }
            })?;
        Ok(Reader { jobs, done })
    }
}

/// The number of CPUs the kernel may run a caller on, one queue each:
/// `/sys/devices/system/cpu/possible` ("0-63"), else those configured.
fn possible_cpus() -> usize {
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok();
    let last = possible
        .as_deref()
        .and_then(|s| s.trim().rsplit(['-', ',']).next()?.parse::<usize>().ok());
    match last {
        Some(last) => last + 1,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

fn on_cpu(cpu: usize, name: String, run: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new().name(name).spawn(move || {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
            tracing::debug!("thread not kept on CPU {cpu}: {e}");
        }
        run()
    })?;
    Ok(())
}
