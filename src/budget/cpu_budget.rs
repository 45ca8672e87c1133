//! A per-thread CPU-time budget for work that runs untrusted code: the model's chat template.
//!
//! minijinja's fuel counts instructions, but some single instructions walk or compare values
//! of any size and are charged as one: `x in a` where `a` was repeated lazily and the result
//! repeated again (`{% set a = a * 100 %}` five times is 10¹⁰ items, built by a handful of
//! instructions and no memory), a `+` of sequences doubled in a loop (lazy too), or `a == b`
//! on two nested lists built by doubling (2⁴⁰ comparisons, a few kilobytes). Nothing inside
//! minijinja can be reached while such an instruction runs, and a thread cannot be stopped
//! from outside. So, as the memory budget does ([`super::alloc_budget`]), a thread that spends
//! more CPU time inside [`with_cpu_budget`] than its limit makes the process print the
//! one-line message it was given (which names the model file) and exit with status 1.
//!
//! A watchdog thread, started on first use, reads the CPU clock of every thread inside a budget
//! every [`TICK`]. On Linux that is the thread's own CPU time, so a busy or paused machine does
//! not count against it; elsewhere it is wall time since the budget began.

use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How often the watchdog reads the clocks of budgeted threads.
pub const TICK: Duration = Duration::from_millis(10);

/// A thread's clock, read from the watchdog.
#[derive(Clone, Copy)]
enum Clock {
    /// The thread's CPU-time clock (`pthread_getcpuclockid`) and its reading at the start.
    #[cfg(target_os = "linux")]
    Cpu(libc::clockid_t, Duration),
    /// Wall time since the budget began.
    Wall(Instant),
}

impl Clock {
    /// The calling thread's clock.
    fn current() -> Clock {
        #[cfg(target_os = "linux")]
        {
            let mut id: libc::clockid_t = 0;
            // SAFETY: pthread_self is the calling, live thread; `id` is a live local.
            if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) } == 0 {
                if let Some(start) = read(id) {
                    return Clock::Cpu(id, start);
                }
            }
        }
        Clock::Wall(Instant::now())
    }

    /// Time spent since the budget began (zero if the clock cannot be read).
    fn spent(self) -> Duration {
        match self {
            #[cfg(target_os = "linux")]
            Clock::Cpu(id, start) => {
                read(id).map_or(Duration::ZERO, |now| now.saturating_sub(start))
            }
            Clock::Wall(start) => start.elapsed(),
        }
    }
}

/// Reads a CPU-time clock.
#[cfg(target_os = "linux")]
fn read(id: libc::clockid_t) -> Option<Duration> {
    // SAFETY: an all-zero timespec is valid; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a live local. The clock belongs to a thread that is inside a budget,
    // which deregisters (under the same lock as this read) before it can end.
    (unsafe { libc::clock_gettime(id, &mut ts) } == 0)
        .then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

struct Budgeted {
    id: u64,
    clock: Clock,
    limit: Duration,
    message: String,
}

#[derive(Default)]
struct Watch {
    next: u64,
    active: Vec<Budgeted>,
}

struct Watchdog {
    watch: Mutex<Watch>,
    wake: Condvar,
}

fn watchdog() -> &'static Watchdog {
    static DOG: OnceLock<Watchdog> = OnceLock::new();
    DOG.get_or_init(|| {
        std::thread::Builder::new()
            .name("candor-cpu-budget".into())
            .spawn(|| {
                let dog = watchdog();
                let mut watch = lock(&dog.watch);
                loop {
                    if let Some(over) = watch.active.iter().find(|b| b.clock.spent() > b.limit) {
                        exceeded(&over.message);
                    }
                    watch = if watch.active.is_empty() {
                        dog.wake.wait(watch).unwrap_or_else(|e| e.into_inner())
                    } else {
                        dog.wake
                            .wait_timeout(watch, TICK)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    };
                }
            })
            .expect("spawning the CPU-time watchdog");
        Watchdog {
            watch: Mutex::new(Watch::default()),
            wake: Condvar::new(),
        }
    })
}

fn lock(m: &Mutex<Watch>) -> MutexGuard<'_, Watch> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cold]
fn exceeded(message: &str) -> ! {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "candor: error: {message}");
    let _ = err.flush();
    std::process::exit(1);
}

/// Removes its thread's entry when the budgeted work ends (or unwinds).
struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&watchdog().watch).active.retain(|b| b.id != self.0);
    }
}

/// Runs `f` on this thread with at most `limit` of CPU time; past it the process prints
/// `candor: error: {message}` on one line and exits with status 1. Budgets may nest; each is
/// measured from its own start.
pub fn with_cpu_budget<T>(limit: Duration, message: &str, f: impl FnOnce() -> T) -> T {
    let dog = watchdog();
    let id = {
        let mut watch = lock(&dog.watch);
        watch.next += 1;
        let id = watch.next;
        watch.active.push(Budgeted {
            id,
            clock: Clock::current(),
            limit,
            message: message.to_owned(),
        });
        id
    };
    dog.wake.notify_one();
    let _registered = Registration(id);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_inside_the_limit_returns_and_leaves_no_entry() {
        let n = with_cpu_budget(Duration::from_secs(5), "unused", || {
            (0..1000u64).map(std::hint::black_box).sum::<u64>()
        });
        assert_eq!(n, 499_500);
        // Nested, and on several threads at once.
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    with_cpu_budget(Duration::from_secs(5), "outer", || {
                        with_cpu_budget(Duration::from_secs(5), "inner", || {
                            std::thread::sleep(3 * TICK)
                        })
                    })
                });
            }
        });
        assert!(lock(&watchdog().watch).active.is_empty());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_clock_counts_this_threads_cpu_time_not_sleep() {
        let clock = Clock::current();
        assert!(matches!(clock, Clock::Cpu(..)));
        std::thread::sleep(Duration::from_millis(200));
        let slept = clock.spent();
        assert!(slept < Duration::from_millis(50), "{slept:?}");
        // Spinning moves it (a wall-time bound keeps a broken clock from hanging the test).
        let start = Instant::now();
        while clock.spent() < slept + Duration::from_millis(50) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the clock did not move"
            );
            std::hint::black_box(());
        }
    }
}
