//! Budgets for untrusted work (a model file's chat template): a per-thread memory budget
//! ([`alloc_budget`], a global allocator) and a per-thread CPU-time budget ([`cpu_budget`]).
//! Past either, the process prints one line naming the file at fault and exits with status 1.

pub mod alloc_budget;
pub mod cpu_budget;
