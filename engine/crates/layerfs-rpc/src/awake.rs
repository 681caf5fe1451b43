//! Keeping a CPU awake while calls come one after another.
//!
//! A client that waits for each reply before its next call (`stat` after
//! `stat`, depth 1) leaves the CPUs idle between the two. Where an idle CPU
//! halts at once (a VM without guest halt polling), waking it costs a VM exit
//! and an interrupt, tens of microseconds, up to twice per call: more than the
//! call itself. So after replies leave for a client that was waiting for
//! them (the server decides when: `Connection::client_waits`), one thread
//! spins for a short window at the lowest priority, and a CPU is still
//! running when the next call comes. It takes only time nothing else wants,
//! and sleeps once no reply has left for the window: an idle server costs
//! nothing. One thread serves the whole process, however many servers it
//! runs. None runs on a machine with a single CPU, nor off Linux, where a
//! thread's priority cannot be lowered alone.
//!
//! Where it spins matters. On the client's CPU, the client takes that CPU
//! from it at every call while the server's thread, alone on the other,
//! halts between calls and wakes for each: a call took about five times as
//! long (75 us against 14 on two vCPUs). So when it keeps losing its CPU, it
//! asks where the client's calls come from (the socket's `SO_INCOMING_CPU`).
//! The thread that answers the client next moves there, and the spinning
//! thread leaves that CPU if it is its own. Client and server then take turns
//! on one CPU, and the spinning thread keeps the other from looking idle to
//! the scheduler, which would otherwise wake them there.

#[cfg(target_os = "linux")]
use std::sync::atomic::AtomicI32;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// Keeps a CPU awake for `window` from now (nothing for a zero window).
/// `client_cpu` says which CPU the waiting client's calls come from; it is
/// asked only when the spinning thread wants to know.
pub(crate) fn keep_awake(window: Duration, client_cpu: impl FnOnce() -> Option<usize>) {
    if window.is_zero() {
        return;
    }
    static PROCESS: OnceLock<Option<Awake>> = OnceLock::new();
    let awake = PROCESS.get_or_init(|| {
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 || !cfg!(target_os = "linux") {
            return None;
        }
        Awake::start()
            .inspect_err(|e| tracing::warn!("no thread keeps a CPU awake: {e}"))
            .ok()
    });
    if let Some(awake) = awake {
        awake.touch(window);
        awake.answer(client_cpu);
    }
}

/// The spinning thread and until when it spins.
struct Awake {
    state: Arc<State>,
    thread: Thread,
}

struct State {
    epoch: Instant,
    /// Nanoseconds since `epoch` until which the thread spins.
    until: AtomicU64,
    /// Set by the thread before it parks; a touch that sees it unparks it.
    sleeping: AtomicBool,
    /// Rounds of spinning so far (for tests).
    rounds: AtomicU64,
    /// Set by the thread when it keeps losing its CPU: the next touch tells
    /// it where the client's calls come from.
    asks: AtomicBool,
    /// That answer, [`UNKNOWN`] until given, [`NOWHERE`] if none can be.
    client_cpu: AtomicUsize,
    /// Times the thread left a CPU (for tests).
    moves: AtomicU64,
    /// The thread's id, once it runs (for tests).
    #[cfg(target_os = "linux")]
    tid: AtomicI32,
}

const UNKNOWN: usize = usize::MAX;
const NOWHERE: usize = usize::MAX - 1;

impl State {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

impl Awake {
    fn start() -> std::io::Result<Awake> {
        let state = Arc::new(State {
            epoch: Instant::now(),
            until: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            asks: AtomicBool::new(false),
            client_cpu: AtomicUsize::new(UNKNOWN),
            moves: AtomicU64::new(0),
            #[cfg(target_os = "linux")]
            tid: AtomicI32::new(0),
        });
        let for_thread = state.clone();
        let join = thread::Builder::new()
            .name("rpc-awake".into())
            .spawn(move || spin(&for_thread))?;
        Ok(Awake {
            state,
            thread: join.thread().clone(),
        })
    }

    /// Spins until at least `window` from now. Costs a system call only when
    /// the thread sleeps.
    fn touch(&self, window: Duration) {
        let until = self.state.now() + window.as_nanos() as u64;
        self.state.until.fetch_max(until, SeqCst);
        if self.state.sleeping.load(SeqCst) {
            self.thread.unpark();
        }
    }

    /// Tells the thread where the client's calls come from, if it asked,
    /// and moves the calling thread, which answers that client, there. One
    /// relaxed load otherwise.
    fn answer(&self, client_cpu: impl FnOnce() -> Option<usize>) {
        if self.state.asks.load(Relaxed) && self.state.asks.swap(false, Relaxed) {
            let cpu = client_cpu().unwrap_or(NOWHERE);
            join(cpu);
            self.state.client_cpu.store(cpu, SeqCst);
        }
    }
}

fn spin(state: &State) {
    #[cfg(target_os = "linux")]
    state
        .tid
        .store(rustix::thread::gettid().as_raw_nonzero().get(), SeqCst);
    lowest_priority();
    let mut crowding = Crowding::default();
    loop {
        let mut last = state.now();
        while last < state.until.load(Relaxed) {
            for _ in 0..16 {
                std::hint::spin_loop();
            }
            state.rounds.fetch_add(1, Relaxed);
            let now = state.now();
            if crowding.round(last, now) {
                state.asks.store(true, Relaxed);
            }
            let answer = state.client_cpu.swap(UNKNOWN, SeqCst);
            if answer != UNKNOWN {
                let moved = leave(answer);
                state.moves.fetch_add(u64::from(moved), Relaxed);
                crowding.answered(moved, now);
            }
            last = state.now();
        }
        // Checked again once `sleeping` is visible: a touch either sees it
        // and unparks, or stored its window before this load.
        state.sleeping.store(true, SeqCst);
        if state.now() >= state.until.load(SeqCst) {
            thread::park();
        }
        state.sleeping.store(false, SeqCst);
    }
}

/// A spin round longer than this lost its CPU to another thread (a round
/// itself takes well under a microsecond).
const LOST_CPU_NS: u64 = 5_000;
/// Rounds that lost the CPU within [`LOST_SPAN_NS`] before the thread asks
/// where the client is: a kernel thread now and then is not a client.
const LOST_ROUNDS: u32 = 2;
const LOST_SPAN_NS: u64 = 1_000_000;
/// After an answer that did not move it, how long the thread does not ask
/// again: whatever takes its CPU (a worker thread) is not the client.
const QUIET_NS: u64 = 2_000_000;

/// Whether the spinning thread keeps losing its CPU, and so should ask
/// where the client's calls come from (sans-IO; times in nanoseconds).
#[derive(Default)]
struct Crowding {
    /// Start of the span in which rounds that lost the CPU are counted.
    span_start: u64,
    lost: u32,
    /// Asked, and waiting for the answer.
    asked: bool,
    /// No asking before this time.
    quiet_until: u64,
}

impl Crowding {
    /// Notes a spin round from `began` to `ended`; true when the thread
    /// should ask.
    fn round(&mut self, began: u64, ended: u64) -> bool {
        if self.asked || ended < self.quiet_until || ended - began < LOST_CPU_NS {
            return false;
        }
        if ended - self.span_start > LOST_SPAN_NS {
            self.span_start = ended;
            self.lost = 0;
        }
        self.lost += 1;
        self.asked = self.lost >= LOST_ROUNDS;
        self.asked
    }

    /// The answer came at `now`, and the thread `moved` or not.
    fn answered(&mut self, moved: bool, now: u64) {
        self.asked = false;
        self.lost = 0;
        if !moved {
            self.quiet_until = now + QUIET_NS;
        }
    }
}

/// Leaves `cpu` if this thread runs on it, for the other CPUs the process
/// may run on (its main thread's). True if it moved.
#[cfg(target_os = "linux")]
fn leave(cpu: usize) -> bool {
    use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity};
    if sched_getcpu() != cpu {
        return false;
    }
    let Ok(mut elsewhere) = sched_getaffinity(Some(rustix::process::getpid())) else {
        return false;
    };
    elsewhere.unset(cpu);
    elsewhere.count() > 0 && sched_setaffinity(None, &elsewhere).is_ok()
}

#[cfg(not(target_os = "linux"))]
fn leave(_cpu: usize) -> bool {
    false
}

/// Moves this thread to `cpu` if it may run there, and leaves it free to run
/// where it could before: the scheduler then wakes it there, next to its
/// client, until something moves it.
#[cfg(target_os = "linux")]
fn join(cpu: usize) {
    use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};
    if cpu >= CpuSet::MAX_CPU || sched_getcpu() == cpu {
        return;
    }
    let Ok(allowed) = sched_getaffinity(None) else {
        return;
    };
    if !allowed.is_set(cpu) {
        return;
    }
    let mut there = CpuSet::new();
    there.set(cpu);
    if sched_setaffinity(None, &there).is_ok() {
        let _ = sched_setaffinity(None, &allowed);
    }
}

#[cfg(not(target_os = "linux"))]
fn join(_cpu: usize) {}

/// Nice 19 for this thread alone: it runs only where nothing else wants to.
/// (`SCHED_IDLE` was measured too, and kept CPUs awake less reliably.)
fn lowest_priority() {
    // Linux sets a thread's nice by its thread id; elsewhere the call would
    // lower the whole process, and no thread spins there.
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19) {
        tracing::debug!("the awake thread keeps its priority: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `cond` for up to 10 s: the machine may be busy.
    fn eventually(cond: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if cond() {
                return true;
            }
            thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn spins_after_a_touch_and_sleeps_once_the_window_is_over() {
        let awake = Awake::start().unwrap();
        let state = &awake.state;
        assert!(
            eventually(|| state.sleeping.load(SeqCst)),
            "asleep at first"
        );
        let before = state.rounds.load(SeqCst);
        awake.touch(Duration::from_millis(50));
        assert!(
            eventually(|| state.rounds.load(SeqCst) > before),
            "spinning after a touch"
        );
        assert!(
            eventually(|| state.sleeping.load(SeqCst)),
            "asleep again after the window"
        );
        // Asleep, it does not spin.
        let rounds = state.rounds.load(SeqCst);
        thread::sleep(Duration::from_millis(100));
        assert_eq!(state.rounds.load(SeqCst), rounds);
    }

    #[test]
    fn a_touch_extends_the_window_and_never_shortens_it() {
        let awake = Awake::start().unwrap();
        let state = &awake.state;
        awake.touch(Duration::from_secs(2));
        assert!(eventually(|| !state.sleeping.load(SeqCst)));
        // A shorter window never cuts a longer one short.
        let until = state.until.load(SeqCst);
        awake.touch(Duration::from_millis(1));
        assert_eq!(state.until.load(SeqCst), until);
        thread::sleep(Duration::from_millis(50));
        assert!(!state.sleeping.load(SeqCst), "still inside the 2 s window");
        assert!(eventually(|| state.sleeping.load(SeqCst)));
    }

    #[test]
    fn asks_where_the_client_is_once_it_keeps_losing_its_cpu() {
        let mut crowding = Crowding::default();
        let lost = LOST_CPU_NS;
        // Rounds that kept the CPU never count.
        let mut t = 1_000;
        for _ in 0..1_000 {
            assert!(!crowding.round(t, t + lost - 1));
            t += lost;
        }
        // Rounds that lost it, within one span, do.
        for i in 1..=LOST_ROUNDS {
            let asks = crowding.round(t, t + lost);
            assert_eq!(asks, i == LOST_ROUNDS, "round {i}");
            t += lost;
        }
        // Asked: nothing more until the answer.
        assert!(!crowding.round(t, t + 10 * lost));
    }

    #[test]
    fn lost_rounds_spread_wider_than_a_span_never_ask() {
        let mut crowding = Crowding::default();
        let mut t = 0;
        for _ in 0..100 {
            t += LOST_SPAN_NS + 1;
            if LOST_ROUNDS > 1 {
                assert!(!crowding.round(t, t + LOST_CPU_NS));
            }
        }
    }

    #[test]
    fn an_answer_that_did_not_move_it_quiets_it_and_one_that_did_does_not() {
        let mut crowding = Crowding::default();
        let lose = |crowding: &mut Crowding, t: u64| {
            (0..LOST_ROUNDS).any(|i| {
                let began = t + u64::from(i) * LOST_CPU_NS;
                crowding.round(began, began + LOST_CPU_NS)
            })
        };
        let t = 10 * LOST_SPAN_NS;
        assert!(lose(&mut crowding, t));
        crowding.answered(false, t);
        assert!(!lose(&mut crowding, t + 1), "quiet after no move");
        assert!(
            lose(&mut crowding, t + QUIET_NS),
            "asks again once quiet ends"
        );
        crowding.answered(true, t + QUIET_NS);
        assert!(
            lose(&mut crowding, t + QUIET_NS + 1),
            "not quiet after a move"
        );
    }

    /// The CPUs this process may run on.
    #[cfg(target_os = "linux")]
    fn process_cpus() -> Vec<usize> {
        let allowed = rustix::thread::sched_getaffinity(Some(rustix::process::getpid())).unwrap();
        (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&cpu| allowed.is_set(cpu))
            .collect()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn leaves_the_cpu_its_client_runs_on_and_no_other() {
        use rustix::process::Pid;
        use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
        let cpus = process_cpus();
        if cpus.len() < 2 {
            layerfs_testkit::skip_or_fail(
                "awake: leaves its client's CPU",
                "this process may run on one CPU only",
            );
            return;
        }
        let awake = Awake::start().unwrap();
        let state = &awake.state;
        awake.touch(Duration::from_secs(3));
        assert!(eventually(|| state.tid.load(SeqCst) != 0));
        let tid = Pid::from_raw(state.tid.load(SeqCst));
        let mut first = CpuSet::new();
        first.set(cpus[0]);
        sched_setaffinity(tid, &first).unwrap();
        let mine = sched_getaffinity(None).unwrap();

        // A client elsewhere: the thread stays.
        state.asks.store(true, SeqCst);
        awake.answer(|| Some(cpus[1]));
        assert!(
            eventually(|| state.client_cpu.load(SeqCst) == UNKNOWN),
            "answer taken"
        );
        assert_eq!(state.moves.load(SeqCst), 0);
        assert_eq!(sched_getaffinity(tid).unwrap(), first);

        // A client on its CPU: the thread leaves it for the others.
        state.asks.store(true, SeqCst);
        awake.answer(|| Some(cpus[0]));
        assert!(eventually(|| state.moves.load(SeqCst) == 1), "moved");
        let mut others = CpuSet::new();
        cpus[1..].iter().for_each(|&cpu| others.set(cpu));
        assert_eq!(sched_getaffinity(tid).unwrap(), others);

        // The thread that answered may still run where it could.
        assert_eq!(sched_getaffinity(None).unwrap(), mine);
    }
}
