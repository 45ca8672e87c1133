//! Integration tests, one binary (linking the model stack once), one module per area.

mod util;

mod arch;
mod engine;
mod fbbench;
mod fennec;
mod realmistake;
mod refutebench;
mod run;
mod tokenizer;
