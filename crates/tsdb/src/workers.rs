//! Scoped work on kept threads: `std::thread::scope`'s contract (closures that borrow the
//! caller's data, all finished before `scope` returns) on threads that outlive the scope and
//! serve the next one.
//!
//! A query splits its selection and evaluation over a few threads several times over (the
//! head's series, the blocks, the evaluation pipeline). With a new thread each time, every
//! part started on an empty allocator heap: each size of allocation first went through
//! mimalloc's slow path, and fresh pages were faulted in and zeroed. An instant query over 8000
//! head series spent a quarter of its CPU time there, more than its parallelism saved.
//!
//! A spawned closure never waits for another: it is handed to an idle kept thread, or to a new
//! one when none is idle (which is kept afterwards). Closures of one scope therefore always run
//! at the same time, as scoped threads do, so they may wait on each other (a barrier, a
//! channel), and a heavy query's parts never queue a small query's behind them. At most
//! `IDLE_KEPT` threads wait for work; one idle for `IDLE_EXIT` ends.
//!
//! Heavy work runs in the background (`background`): its closures go to kept threads of their
//! own whose nice value is `BACKGROUND_NICE`, so that when the cores are short the scheduler
//! gives a small query's threads most of them, and a heavy query takes what is left. A thread
//! cannot lower its nice value again without privileges, so background threads stay
//! background and are kept apart from the others.

use std::any::Any;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Idle threads of each kind kept for the next scope; more than this end when their closure
/// returns. A
/// kept thread keeps its thread-local scratch too (a window plan, decoding columns, a zstd
/// context: a few MiB at most), so this bounds memory as well; a server on a few cores runs
/// a handful of parts at once.
const IDLE_KEPT: usize = 16;

/// A kept thread idle this long ends.
const IDLE_EXIT: Duration = Duration::from_secs(60);

/// A kept thread idle this long runs the idle hook (`on_idle`) once: back-to-back queries (a
/// dashboard's panels) find their heaps warm, and memory they freed goes back to the system
/// after a quiet second rather than staying with idle threads.
const IDLE_RELEASE: Duration = Duration::from_secs(1);

/// What a kept thread runs once it has been idle for `IDLE_RELEASE` (see `on_idle`).
static IDLE_HOOK: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what a kept thread runs once idle for a second: the server gives its allocator's
/// freed pages of that thread back to the system (`mi_collect`), which the allocator does
/// itself only when the thread allocates again. Set once; later calls are ignored.
pub fn on_idle(hook: fn()) {
    let _ = IDLE_HOOK.set(hook);
}

/// A closure with its lifetime erased: only `Scope::spawn` makes them, and its scope waits
/// for each to have run before the borrowed data can go.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// Idle threads, each by the sending end of its own queue and a number naming it.
static IDLE: Mutex<Vec<(u64, Sender<Job>)>> = Mutex::new(Vec::new());
/// Idle background threads, likewise.
static IDLE_BACKGROUND: Mutex<Vec<(u64, Sender<Job>)>> = Mutex::new(Vec::new());

/// The nice value of background threads. CFS weighs a thread at nice 10 about a tenth of one
/// at nice 0: a query in the foreground beside one in the background gets about 90% of a core
/// they share, and the background one all of it when alone.
pub const BACKGROUND_NICE: i32 = 10;

thread_local! {
    /// Whether closures spawned from this thread go to background threads: set on background
    /// threads (their own spawns stay there) and, for a while, by `background`.
    static IN_BACKGROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While the returned guard lives, closures spawned from this thread (and from the closures,
/// which run on background threads) run on background threads, if `heavy`. The calling thread
/// itself keeps its priority.
pub fn background(heavy: bool) -> FlagGuard {
    let was = IN_BACKGROUND.with(|b| b.replace(b.get() || heavy));
    FlagGuard { flag: &IN_BACKGROUND, was }
}

/// Restores one of this module's thread-local flags when dropped (see `background` and
/// `serial`).
#[derive(Debug)]
pub struct FlagGuard {
    flag: &'static std::thread::LocalKey<std::cell::Cell<bool>>,
    was: bool,
}

impl Drop for FlagGuard {
    fn drop(&mut self) {
        self.flag.with(|f| f.set(self.was));
    }
}

/// Whether closures spawned from this thread now run in the background.
pub fn in_background() -> bool {
    IN_BACKGROUND.with(|b| b.get())
}

thread_local! {
    /// Whether work on this thread is one of several parallel parts already (see `serial`).
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While the returned guard lives, work on this thread that would split itself over threads
/// (a selection, an evaluation) runs on this thread alone (`threads_here`): it is one of
/// several parts already running in parallel, such as a time slice of a range query.
pub fn serial() -> FlagGuard {
    FlagGuard { flag: &SERIAL, was: SERIAL.with(|s| s.replace(true)) }
}

/// How many threads work started here may use, of `threads`: one inside `serial`.
pub fn threads_here(threads: usize) -> usize {
    if SERIAL.with(|s| s.get()) {
        1
    } else {
        threads.max(1)
    }
}

/// Numbers for kept threads.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded state stays consistent across a panic (closures run outside the locks).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `body` with a scope whose `spawn`ed closures may borrow what outlives the call; returns
/// once every one of them has returned. A closure's panic is handed to whoever joins its handle;
/// if nobody does, `scope` panics once all are done (as `std::thread::scope` does).
pub fn scope<'env, R>(body: impl FnOnce(&Scope<'env>) -> R) -> R {
    let scope = Scope { pending: Arc::new(Pending::default()), _env: PhantomData };
    // Waits for the closures even when `body` unwinds: they borrow its caller's data.
    struct WaitForAll<'a>(&'a Pending);
    impl Drop for WaitForAll<'_> {
        fn drop(&mut self) {
            let mut running = lock(&self.0.running);
            while *running > 0 {
                running = self.0.done.wait(running).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
    let wait = WaitForAll(&scope.pending);
    let result = body(&scope);
    drop(wait);
    if scope.pending.unjoined_panics.load(Ordering::Acquire) > 0 {
        panic!("a scoped worker panicked");
    }
    result
}

/// What a scope's closures share with it.
#[derive(Debug, Default)]
struct Pending {
    /// Closures spawned and not yet returned.
    running: Mutex<usize>,
    done: Condvar,
    /// Closures that panicked and whose handle has not taken the panic.
    unjoined_panics: AtomicUsize,
}

/// Spawns closures that borrow data living for `'env` (see `scope`).
#[derive(Debug)]
pub struct Scope<'env> {
    pending: Arc<Pending>,
    /// Invariant in `'env`, as `std::thread::Scope` is.
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'env> Scope<'env> {
    /// Runs `f` on a kept thread (or a new one), at once.
    pub fn spawn<T: Send + 'env>(&self, f: impl FnOnce() -> T + Send + 'env) -> Handle<T> {
        let slot = Arc::new(Slot { result: Mutex::new(None), ready: Condvar::new() });
        let pending = self.pending.clone();
        *lock(&pending.running) += 1;
        let theirs = slot.clone();
        let job: Box<dyn FnOnce() + Send + 'env> = Box::new(move || {
            let result = catch_unwind(AssertUnwindSafe(f));
            if result.is_err() {
                pending.unjoined_panics.fetch_add(1, Ordering::AcqRel);
            }
            *lock(&theirs.result) = Some(result);
            theirs.ready.notify_all();
            // Nothing of `'env` may be touched once the scope is told, so the slot goes first:
            // if no handle holds it any more, the result (which may borrow) is dropped here.
            drop(theirs);
            let mut running = lock(&pending.running);
            *running -= 1;
            if *running == 0 {
                pending.done.notify_all();
            }
        });
        // SAFETY: only the lifetime changes. `scope` does not return (nor unwind past its
        // frame) before `running` is back to zero, which this closure does last, after it has
        // run `f` and let go of everything that borrows `'env`; the data it borrows outlives
        // `scope`'s call.
        let job: Job = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'env>, Job>(job) };
        if let Err(e) = run(job, in_background()) {
            // The closure went unrun (dropped with the refused thread's start): no longer
            // waited for. As `std::thread::scope`'s spawn, a refused thread is a panic.
            let mut running = lock(&self.pending.running);
            *running -= 1;
            if *running == 0 {
                self.pending.done.notify_all();
            }
            drop(running);
            panic!("failed to spawn a worker thread: {e}");
        }
        Handle { slot, pending: self.pending.clone() }
    }
}

/// Where a closure's result waits for its handle.
#[derive(Debug)]
struct Slot<T> {
    result: Mutex<Option<std::thread::Result<T>>>,
    ready: Condvar,
}

/// A spawned closure's result, once it has returned.
#[derive(Debug)]
pub struct Handle<T> {
    slot: Arc<Slot<T>>,
    pending: Arc<Pending>,
}

impl<T> Handle<T> {
    /// Waits for the closure; its value, or its panic.
    pub fn join(self) -> Result<T, Box<dyn Any + Send + 'static>> {
        let mut result = lock(&self.slot.result);
        loop {
            match result.take() {
                Some(r) => {
                    if r.is_err() {
                        self.pending.unjoined_panics.fetch_sub(1, Ordering::AcqRel);
                    }
                    return r;
                }
                None => result = self.slot.ready.wait(result).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }
}

/// Hands `job` to an idle kept thread (a background one if `background`), or to a new one;
/// an error if the OS refuses a thread.
fn run(mut job: Job, background: bool) -> std::io::Result<()> {
    let list = if background { &IDLE_BACKGROUND } else { &IDLE };
    loop {
        let idle = lock(list).pop();
        match idle {
            Some((_, tx)) => match tx.send(job) {
                Ok(()) => return Ok(()),
                // That thread has ended (it cannot have: an idle thread ends only after taking
                // itself off the list; kept for safety): try the next.
                Err(e) => job = e.0,
            },
            None => return start_thread(job, background),
        }
    }
}

/// Lowers the calling thread's priority to `BACKGROUND_NICE` (on Linux, `setpriority` of
/// `PRIO_PROCESS` 0 sets the calling thread's nice value, not the process's).
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: a plain system call on the calling thread, with no pointers.
    unsafe {
        // Raising one's own nice value needs no privilege; a failure leaves the thread at its
        // priority, which is still correct, only less fair.
        let _ = libc::setpriority(libc::PRIO_PROCESS, 0, BACKGROUND_NICE);
    }
}

/// A new kept thread that runs `first`, then whatever it is handed while idle.
fn start_thread(first: Job, background: bool) -> std::io::Result<()> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = channel::<Job>();
    let name = if background { "strata-bg-worker" } else { "strata-worker" };
    let list = if background { &IDLE_BACKGROUND } else { &IDLE };
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        if background {
            lower_this_threads_priority();
            IN_BACKGROUND.with(|b| b.set(true));
        }
        let mut job = first;
        loop {
            job();
            // A closure may leave its thread's spawn setting changed only inside a guard.
            debug_assert_eq!(in_background(), background, "a background guard outlived its closure");
            // Idle: on the list if there is room, else done.
            {
                let mut idle = lock(list);
                if idle.len() >= IDLE_KEPT {
                    return;
                }
                idle.push((id, tx.clone()));
            }
            let mut released = false;
            job = loop {
                let wait = if released { IDLE_EXIT - IDLE_RELEASE } else { IDLE_RELEASE };
                match rx.recv_timeout(wait) {
                    Ok(next) => break next,
                    Err(RecvTimeoutError::Timeout) if !released => {
                        released = true;
                        if let Some(hook) = IDLE_HOOK.get() {
                            hook();
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        // Off the list, unless a spawner has just taken it (its job is coming).
                        let mut idle = lock(list);
                        if let Some(at) = idle.iter().position(|(other, _)| *other == id) {
                            idle.swap_remove(at);
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            };
        }
    });
    spawned.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn closures_borrow_the_callers_data_and_return_their_values() {
        let data: Vec<u64> = (0..1000).collect();
        let total = scope(|s| {
            let parts: Vec<_> = data.chunks(100).map(|part| s.spawn(move || part.iter().sum::<u64>())).collect();
            parts.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        assert_eq!(total, 999 * 1000 / 2);
    }

    #[test]
    fn closures_of_one_scope_run_at_the_same_time() {
        // Eight closures that each wait for all eight: they finish only if none waits for a
        // thread another holds.
        let barrier = Barrier::new(8);
        let count = AtomicUsize::new(0);
        scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    barrier.wait();
                    count.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        assert_eq!(count.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn scope_returns_only_after_every_closure() {
        let done = AtomicUsize::new(0);
        scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    done.fetch_add(1, Ordering::Relaxed);
                });
            }
        });
        assert_eq!(done.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn background_closures_run_on_lowered_threads_and_spawn_there_too() {
        fn nice() -> i32 {
            // SAFETY: a plain system call on the calling thread.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
        }
        let name = || std::thread::current().name().map(String::from);
        let ours = nice();
        let (fore, back, nested) = {
            let fore = scope(|s| s.spawn(|| (nice(), name())).join().unwrap());
            let _bg = background(true);
            assert!(in_background());
            let back = scope(|s| s.spawn(|| (nice(), name())).join().unwrap());
            let nested = scope(|s| s.spawn(|| scope(|s| s.spawn(|| (nice(), name())).join().unwrap())).join().unwrap());
            (fore, back, nested)
        };
        // The guard is gone: this thread spawns in the foreground again, and kept its own nice.
        assert!(!in_background());
        assert_eq!(nice(), ours);
        assert_eq!(fore.1.as_deref(), Some("strata-worker"));
        assert_eq!(back.1.as_deref(), Some("strata-bg-worker"));
        assert_eq!(nested.1.as_deref(), Some("strata-bg-worker"));
        assert_eq!(fore.0, ours);
        assert_eq!(back.0, BACKGROUND_NICE.max(ours));
        assert_eq!(nested.0, back.0);
        // `background(false)` changes nothing, and does not undo an enclosing guard.
        let _bg = background(true);
        drop(background(false));
        assert!(in_background());
    }

    #[test]
    fn a_thread_idle_for_a_second_runs_the_idle_hook() {
        static RAN_ON: Mutex<Vec<String>> = Mutex::new(Vec::new());
        fn note() {
            let name = std::thread::current().name().unwrap_or("").to_string();
            lock(&RAN_ON).push(name);
        }
        on_idle(note);
        scope(|s| s.spawn(|| ()).join().unwrap());
        // On the kept thread (other tests' threads may have run it too), once per idle spell.
        // Waited for rather than slept on: tests running beside this one take the kept threads
        // for their own scopes, and each use starts a thread's idle spell again (a fixed
        // sleep of the spell and half a second failed on a loaded 2-core machine).
        let deadline = std::time::Instant::now() + IDLE_RELEASE * 30;
        while !lock(&RAN_ON).iter().any(|n| n == "strata-worker") && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let ran = lock(&RAN_ON).clone();
        assert!(ran.iter().any(|n| n == "strata-worker"), "{ran:?}");
        assert!(ran.iter().all(|n| n.starts_with("strata-")), "{ran:?}");
    }

    #[test]
    fn threads_are_kept_for_the_next_scope() {
        let name = || std::thread::current().id();
        let first = scope(|s| s.spawn(name).join().unwrap());
        // Other tests run at the same time and may take that thread; some scope gets it back.
        let reused = (0..200).any(|_| scope(|s| s.spawn(name).join().unwrap()) == first);
        assert!(reused, "a thread that finished a closure serves a later scope");
    }

    #[test]
    fn a_joined_panic_is_the_joiners() {
        let r = scope(|s| s.spawn(|| panic!("inside")).join());
        let payload = r.expect_err("the closure panicked");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"inside"));
    }

    #[test]
    fn an_unjoined_panic_panics_the_scope_after_the_others_finish() {
        let finished = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            scope(|s| {
                s.spawn(|| panic!("unjoined"));
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    finished.fetch_add(1, Ordering::Relaxed);
                });
            })
        }));
        assert!(r.is_err(), "the scope panics");
        assert_eq!(finished.load(Ordering::Relaxed), 1, "after the other closure returned");
        // The thread that ran the panicking closure still serves.
        assert_eq!(scope(|s| s.spawn(|| 7).join().unwrap()), 7);
    }

    #[test]
    fn a_panicking_body_still_waits_for_its_closures() {
        let finished = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    finished.fetch_add(1, Ordering::Relaxed);
                });
                panic!("body");
            })
        }));
        assert!(r.is_err());
        assert_eq!(finished.load(Ordering::Relaxed), 1);
    }
}
