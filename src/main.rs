/// Chat templates run under a per-thread memory budget ([`candor::budget::alloc_budget`]),
/// which counts through this allocator.
#[global_allocator]
static ALLOCATOR: candor::budget::alloc_budget::BudgetAllocator =
    candor::budget::alloc_budget::BudgetAllocator;

fn main() {
    std::process::exit(candor::cli::run());
}
