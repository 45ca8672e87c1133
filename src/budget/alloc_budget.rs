//! A per-thread memory budget for work that runs untrusted code: the model's chat template.
//!
//! minijinja's fuel bounds the number of instructions a template executes, and the rendered
//! output is capped by [`crate::text::chat_template`], but neither bounds the size of intermediate
//! values: a template that doubles a string 40 times executes a few hundred instructions and
//! asks for a terabyte. This module provides a global allocator, [`BudgetAllocator`], that
//! forwards to the system allocator and, only on a thread inside [`with_budget`], counts the
//! bytes that thread holds. The library does not install it (that is the program's choice):
//! the `candor` binary, the test binaries and the benches do, with
//! `#[global_allocator] static A: BudgetAllocator = BudgetAllocator;`. Where it is not installed
//! [`with_budget`] refuses to run untrusted work rather than run it unbounded.
//! A thread that goes over its budget cannot be unwound out of the allocator (that is
//! undefined behaviour), so the process prints the one-line message given to [`with_budget`]
//! (which names the model file) and exits with status 1: memory stays bounded and the user
//! is told which file is at fault. Outside a budget the allocator costs one thread-local read.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Forwards to [`System`], counting a budgeted thread's bytes. Install it as the program's
/// global allocator for [`with_budget`] to work.
pub struct BudgetAllocator;

/// Set by the first allocation through [`BudgetAllocator`]: it is the global allocator.
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Bytes this thread may still take inside a budget; `None` outside one.
    static REMAINING: Cell<Option<isize>> = const { Cell::new(None) };
    /// The message printed when the budget runs out (pointer and length of a string owned
    /// by the active [`with_budget`] call).
    static MESSAGE: Cell<(*const u8, usize)> = const { Cell::new((std::ptr::null(), 0)) };
}

fn charge(bytes: isize) {
    let over = REMAINING.with(|r| match r.get() {
        None => false,
        Some(left) => {
            let left = left.saturating_sub(bytes);
            r.set(Some(left));
            left < 0
        }
    });
    if over {
        exceeded();
    }
}

#[cold]
fn exceeded() -> ! {
    REMAINING.with(|r| r.set(None));
    let (ptr, len) = MESSAGE.with(|m| m.get());
    let mut err = std::io::stderr().lock();
    if !ptr.is_null() {
        // SAFETY: `with_budget` keeps the string alive while the budget is active, and the
        // budget is only active on this thread.
        let msg = unsafe { std::slice::from_raw_parts(ptr, len) };
        let _ = err.write_all(b"candor: error: ");
        let _ = err.write_all(msg);
        let _ = err.write_all(b"\n");
    }
    let _ = err.flush();
    std::process::exit(1);
}

// SAFETY: every call forwards to `System` with the same arguments; the bookkeeping touches
// only const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for BudgetAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe {
            if !INSTALLED.load(Ordering::Relaxed) {
                INSTALLED.store(true, Ordering::Relaxed);
            }
            charge(layout.size() as isize);
            System.alloc(layout)
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe {
            charge(layout.size() as isize);
            System.alloc_zeroed(layout)
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe {
            REMAINING.with(|r| {
                if let Some(left) = r.get() {
                    r.set(Some(left.saturating_add(layout.size() as isize)));
                }
            });
            System.dealloc(ptr, layout)
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            charge(new_size as isize - layout.size() as isize);
            System.realloc(ptr, layout, new_size)
        }
    }
}

/// [`with_budget`] was called in a program whose global allocator is not [`BudgetAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "this program does not install candor::budget::alloc_budget::BudgetAllocator as its global \
     allocator, so untrusted work (a chat template) cannot be bounded in memory"
)]
pub struct NotInstalled;

/// Whether [`BudgetAllocator`] is the global allocator (it has served an allocation).
pub fn installed() -> bool {
    // Something allocated before any caller gets here (the argument strings, the runtime).
    INSTALLED.load(Ordering::Relaxed)
}

/// Runs `f` with at most `bytes` more bytes held by this thread. Going over prints `message`
/// (one line) and exits the process with status 1. Budgets do not nest: an inner call runs
/// under the outer budget. Refused (`f` is not run) where [`BudgetAllocator`] is not the
/// global allocator.
pub fn with_budget<T>(
    bytes: usize,
    message: &str,
    f: impl FnOnce() -> T,
) -> Result<T, NotInstalled> {
    if !installed() {
        return Err(NotInstalled);
    }
    if REMAINING.with(|r| r.get()).is_some() {
        return Ok(f());
    }
    let message = message.replace('\n', " ");
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            REMAINING.with(|r| r.set(None));
            MESSAGE.with(|m| m.set((std::ptr::null(), 0)));
        }
    }
    let _reset = Reset;
    MESSAGE.with(|m| m.set((message.as_ptr(), message.len())));
    REMAINING.with(|r| r.set(Some(bytes.min(isize::MAX as usize) as isize)));
    Ok(f())
}

/// Bytes this thread may still take inside the active [`with_budget`] call; `None` outside one.
/// The difference between two readings is what the thread allocated (net of frees) between them.
pub fn remaining() -> Option<isize> {
    REMAINING.with(|r| r.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_only_inside_and_is_released() {
        let v = with_budget(1 << 20, "unused", || vec![0u8; 1 << 19]).unwrap();
        assert_eq!(v.len(), 1 << 19);
        assert!(REMAINING.with(|r| r.get()).is_none());
        // Freed inside: the same budget fits many short-lived allocations.
        with_budget(1 << 20, "unused", || {
            for _ in 0..100 {
                let v = vec![1u8; 1 << 19];
                assert_eq!(v[0], 1);
            }
        })
        .unwrap();
        // Outside a budget nothing is counted.
        let big = vec![0u8; 8 << 20];
        assert_eq!(big.len(), 8 << 20);
    }
}
