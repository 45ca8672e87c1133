//! Integration tests, one binary (linking the model stack once), one module per area.

/// Chat templates run under a memory budget, which counts through this allocator.
#[global_allocator]
static ALLOCATOR: candor::budget::alloc_budget::BudgetAllocator =
    candor::budget::alloc_budget::BudgetAllocator;

mod util;

mod arch;
mod compare;
mod data;
mod deepseek2;
mod engine;
mod fbbench;
mod fennec;
mod fuzz;
mod gemma4;
mod glm4moe;
mod gpt_oss;
#[cfg(feature = "cuda")]
mod gpu;
mod hostile;
mod hub;
mod hybrid;
mod hybrid_moe;
mod memory;
mod mistral3;
mod moe;
mod own_data;
mod panel;
mod phi3;
mod phimoe;
mod quant;
mod qwen3next;
mod qwen3vl;
mod realmistake;
mod refutebench;
mod refutebench_lang;
mod reliability;
mod report;
mod run;
mod serve;
mod smollm3;
mod spec;
mod split;
mod thinking;
mod tokenizer;
mod yarn;
