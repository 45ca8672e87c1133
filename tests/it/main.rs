//! Integration tests, one binary (linking the model stack once), one module per area.

mod util;

mod engine;
mod fbbench;
mod fennec;
mod quant;
mod realmistake;
mod refutebench;
mod run;
mod tokenizer;
