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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// Keeps a CPU awake for `window` from now (nothing for a zero window).
pub(crate) fn keep_awake(window: Duration) {
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
}

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
}

fn spin(state: &State) {
    lowest_priority();
    loop {
        while state.now() < state.until.load(Relaxed) {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            state.rounds.fetch_add(1, Relaxed);
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
}
