//! Keeps a compute pool's threads awake for the length of one forward pass (hostd) or one
//! burst of MoE calls (expertd's ring worker), so that each parallel region (a few hundred per
//! decode token) starts on threads that are already running instead of waking sleeping ones.
//!
//! Between two parallel regions of a decode step the model runs tens to hundreds of µs of
//! single-threaded work (norms, conv, gates, softmax). That is long enough for an idle rayon
//! worker to go to sleep, and on a virtual machine waking it again (a futex wake, then an
//! inter-processor interrupt to a halted vCPU) took 60–100 µs per region here: about as long
//! as a 2 MiB projection itself. [`run`] runs the pass on one pool thread and keeps every other
//! pool thread in a loop that executes whatever rayon work appears (`rayon::yield_now`, which
//! steals) and otherwise spins, until the pass returns. Nothing about the work changes: the
//! same jobs run through the same rayon calls, so every result is bitwise what it was.
//!
//! The price is that the other threads hold their cores for the whole pass. That is the point
//! when hostd owns the cores ([`Awake::Spin`]), and wrong when something else must run beside
//! the pass on them (expertd computing a call on the same machine): there the idle threads
//! yield the core ([`Awake::Yield`], `sched_yield`) between their checks for work, so that any
//! runnable thread (the daemon's worker and compute threads) takes it at once, while a core
//! nobody else wants stays busy instead of halting and paying the wake-up.

use rayon::Yield;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long the pass waits for the other threads' spinners to start before it starts without
/// them (a thread busy elsewhere, or descheduled); a spinner that starts later does not spin.
/// Waking a sleeping worker took 60–100 µs here.
const CHECK_IN_WAIT: Duration = Duration::from_millis(1);

/// What the pool's other threads do while a pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awake {
    /// Nothing: they sleep between parallel regions as rayon's own do.
    Off,
    /// Take rayon work as it appears and spin in between (hostd owns the cores).
    Spin,
    /// Take rayon work as it appears and yield the core in between (something else, expertd,
    /// computes on these cores while the pass waits for it).
    Yield,
}

/// Runs `f` on a thread of the current rayon pool with the pool's other threads kept awake
/// until it returns (see the module doc). With [`Awake::Off`], with one thread, or when
/// already on a pool thread (a nested call), it just runs `f` here. One kept-awake pass at a
/// time: a second, started from another thread meanwhile, runs in place.
pub fn run<R: Send>(awake: Awake, f: impl FnOnce() -> R + Send) -> R {
    run_in(None, awake, f)
}

/// [`run`] on `pool` (expertd's compute pool). The pool belongs to the caller, who must keep
/// two such calls from overlapping (the second would wait for the first to end before its
/// pass starts: each broadcast job needs every thread).
pub fn run_on<R: Send>(pool: &rayon::ThreadPool, awake: Awake, f: impl FnOnce() -> R + Send) -> R {
    run_in(Some(pool), awake, f)
}

/// [`run`] on `pool`, or on the global pool when `None`.
fn run_in<R: Send>(
    pool: Option<&rayon::ThreadPool>,
    awake: Awake,
    f: impl FnOnce() -> R + Send,
) -> R {
    let threads = pool.map_or_else(
        rayon::current_num_threads,
        rayon::ThreadPool::current_num_threads,
    );
    let nested = pool.map_or_else(
        || rayon::current_thread_index().is_some(),
        |p| p.current_thread_index().is_some(),
    );
    if awake == Awake::Off || threads < 2 || nested {
        return f();
    }
    // One kept-awake pass at a time on the global pool: two passes started from two threads
    // would share its threads and hold each other's callers until both end. A second one runs
    // in place. (A pool passed in belongs to its caller.)
    static ONE_PASS: Mutex<()> = Mutex::new(());
    let _one = match pool.is_none().then(|| ONE_PASS.try_lock()) {
        None => None,
        Some(Ok(g)) => Some(g),
        Some(Err(std::sync::TryLockError::Poisoned(p))) => Some(p.into_inner()),
        Some(Err(std::sync::TryLockError::WouldBlock)) => return f(),
    };
    let done = AtomicBool::new(false);
    let started = AtomicBool::new(false);
    let checked_in = AtomicUsize::new(0);
    let work = Mutex::new(Some(f));
    let result: Mutex<Option<R>> = Mutex::new(None);
    let yield_core = awake == Awake::Yield;
    // One broadcast job per pool thread; a broadcast job runs only on the thread it was sent
    // to, so no spinner ever runs on thread 0, which must end them.
    //
    // A spinner must never run inside one of the pass's own jobs: a thread that steals a job
    // of the pass before taking its broadcast job (it was searching for work when the
    // broadcast came), and then meets its broadcast job while that stolen job waits in a
    // nested join, would spin on top of the job until the pass ends, while the pass waits for
    // that job: a deadlock (seen in `hostd serve`). So the pass first waits, briefly, for the
    // spinners to start; then `started` is set before any job of the pass exists, and a
    // spinner that finds it set (it may sit on top of such a job) returns at once.
    let job = |ctx: rayon::BroadcastContext<'_>| {
        if ctx.index() == 0 {
            // Ends the spinners however the pass ends, a panic included (rayon re-raises it
            // from `broadcast` once every thread has returned).
            let _end = SetOnDrop(&done);
            let deadline = Instant::now() + CHECK_IN_WAIT;
            while checked_in.load(Ordering::Acquire) + 1 < ctx.num_threads()
                && Instant::now() < deadline
            {
                pause(yield_core);
            }
            // Every job of the pass is pushed after this store, and taking a job from a rayon
            // deque synchronises with its push: a thread that runs on top of such a job sees
            // the flag set.
            started.store(true, Ordering::SeqCst);
            let f = work
                .lock()
                .expect("keep_awake: work lock")
                .take()
                .expect("keep_awake: the pass runs once");
            let r = f();
            *result.lock().expect("keep_awake: result lock") = Some(r);
        } else if started.load(Ordering::SeqCst) {
            // Possibly nested inside a job of this pass (see above): do not spin.
            #[cfg(test)]
            tests::note_late_spinner();
        } else {
            // Started before any job of the pass existed, so not inside one of them.
            checked_in.fetch_add(1, Ordering::AcqRel);
            spin_until(&done, yield_core);
        }
    };
    match pool {
        Some(p) => p.broadcast(job),
        None => rayon::broadcast(job),
    };
    result
        .into_inner()
        .expect("keep_awake: result lock")
        .expect("keep_awake: thread 0 ran the pass")
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Executes rayon work as it appears, spinning (or yielding the core) in between, until `done`
/// is set.
fn spin_until(done: &AtomicBool, yield_core: bool) {
    while !done.load(Ordering::Acquire) {
        if rayon::yield_now() != Some(Yield::Executed) {
            pause(yield_core);
        }
    }
}

/// One idle step of a waiting loop: yield the core, or a spin-loop hint.
fn pause(yield_core: bool) {
    if yield_core {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Spinners that found their pass already started and returned without spinning.
    /// Names of the pool threads whose spinner found its pass already started and returned
    /// without spinning (tests run in parallel, so each test names its own pool's threads).
    static LATE_SPINNERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    pub(super) fn note_late_spinner() {
        if let Some(name) = std::thread::current().name() {
            LATE_SPINNERS
                .lock()
                .expect("late spinners")
                .push(name.to_owned());
        }
    }

    fn spinner_was_late(thread_name: &str) -> bool {
        LATE_SPINNERS
            .lock()
            .expect("late spinners")
            .iter()
            .any(|n| n == thread_name)
    }

    #[test]
    fn runs_the_pass_once_on_pool_thread_zero_with_parallel_work_inside() {
        // Called from this test thread, outside every pool: the global pool. Another test's
        // pass may hold the one-pass lock for a while (this one then runs in place): retry.
        let expected = if rayon::current_num_threads() >= 2 {
            Some(0)
        } else {
            None
        };
        let start = Instant::now();
        loop {
            let calls = AtomicUsize::new(0);
            let (idx, sum) = run(Awake::Spin, || {
                calls.fetch_add(1, Ordering::SeqCst);
                (
                    rayon::current_thread_index(),
                    (0..100_000u64).into_par_iter().map(|v| v ^ 5).sum::<u64>(),
                )
            });
            assert_eq!(calls.load(Ordering::SeqCst), 1);
            assert_eq!(sum, (0..100_000u64).map(|v| v ^ 5).sum::<u64>());
            if idx == expected {
                break;
            }
            assert_eq!(
                idx, None,
                "a pass runs on pool thread 0 or, when another holds the pool, in place"
            );
            assert!(
                start.elapsed().as_secs() < 60,
                "never ran on pool thread 0 in 60 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Off: in place, off the pool.
        assert_eq!(run(Awake::Off, rayon::current_thread_index), None);
    }

    #[test]
    fn nested_in_a_pool_thread_it_runs_in_place() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        // From every thread of the pool in turn (an `install` job may land on thread 0, where
        // running in place and running as the pass look alike).
        let seen = pool.broadcast(|_| {
            run_on(&pool, Awake::Spin, || pool.current_thread_index())
                == pool.current_thread_index()
        });
        assert!(
            seen.iter().all(|&ok| ok),
            "a nested call ran elsewhere: {seen:?}"
        );
    }

    #[test]
    fn on_a_pool_of_its_own_the_pass_runs_on_thread_zero_and_the_spinners_take_work() {
        for awake in [Awake::Spin, Awake::Yield] {
            takes_work(awake);
        }
    }

    fn takes_work(awake: Awake) {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        let (idx, ran_on) = run_on(&pool, awake, || {
            let ran_on: Vec<Option<usize>> = (0..64)
                .into_par_iter()
                .map(|_| {
                    std::thread::sleep(Duration::from_micros(300));
                    rayon::current_thread_index()
                })
                .collect();
            (rayon::current_thread_index(), ran_on)
        });
        assert_eq!(idx, Some(0), "{awake:?}: the pass runs on pool thread 0");
        assert!(
            ran_on.iter().any(|&t| t.is_some_and(|t| t != 0)),
            "{awake:?}: no spinner took work: {ran_on:?}"
        );
        // Off: in place, off the pool.
        assert_eq!(run_on(&pool, Awake::Off, rayon::current_thread_index), None);
    }

    #[test]
    fn a_spinner_that_starts_after_its_pass_began_does_not_spin() {
        // Thread 1 is kept busy past CHECK_IN_WAIT, so the pass starts without its spinner;
        // when the spinner finally runs it may be inside one of the pass's jobs, so it must
        // return at once. The pass waits for that; had the spinner spun until the pass ends,
        // the pass would never see it return (the wait below times out).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .thread_name(|i| format!("late-spinner-test-{i}"))
            .build()
            .expect("pool");
        let release = std::sync::Arc::new(AtomicBool::new(false));
        let busy = std::sync::Arc::new(AtomicBool::new(false));
        let (r, b) = (
            std::sync::Arc::clone(&release),
            std::sync::Arc::clone(&busy),
        );
        // Thread 0 will take the pass; keep thread 1 busy in a job of its own until released.
        pool.spawn_broadcast(move |ctx| {
            if ctx.index() == 1 {
                b.store(true, Ordering::SeqCst);
                while !r.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
            }
        });
        while !busy.load(Ordering::SeqCst) {
            std::hint::spin_loop();
        }
        let returned = run_on(&pool, Awake::Spin, || {
            release.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !spinner_was_late("late-spinner-test-1") && Instant::now() < deadline {
                std::thread::yield_now();
            }
            spinner_was_late("late-spinner-test-1")
        });
        assert!(
            returned,
            "a spinner that started after its pass began kept spinning"
        );
    }

    #[test]
    fn a_panicking_pass_ends_the_spinners_and_reaches_the_caller() {
        // On its own thread, so that a spinner left running fails this test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let caught =
                std::panic::catch_unwind(|| run(Awake::Yield, || -> u32 { panic!("pass failed") }));
            // Had a spinner been left running, the pool would never take this pass.
            let after = run(Awake::Spin, || (0..1000u32).into_par_iter().sum::<u32>());
            tx.send((caught.is_err(), after)).expect("send");
        });
        let (panicked, after) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the pool is stuck: a spinner outlived its pass");
        assert!(panicked, "the panic reaches the caller");
        assert_eq!(after, 499_500);
    }
}
