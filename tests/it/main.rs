//! Integration tests, one binary (linking the model stack once), one module per area.

mod util;

mod engine;
mod fbbench;
mod fennec;
mod realmistake;
mod refutebench;
mod report;
mod run;
mod tokenizer;
