//! The command line: parse arguments, turn them into configs, call the library, print errors.
//!
//! `anyhow` lives here and in `main.rs` only; library modules return typed errors.

mod args;
mod bench;
mod cache;
mod compare;
mod data;
mod devices;
mod draft;
mod generate;
mod launch;
mod merge;
mod models;
mod options;
mod replicas;
mod report;
mod run;
mod score;
mod serve;
mod setup;
mod verify;

use clap::Parser;

pub use args::{Args, Command};

/// Runs the program and returns its exit code; errors are printed with their whole chain.
pub fn run() -> i32 {
    let args = Args::parse();
    let result = match args.command {
        Command::Setup(a) => setup::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Score(a) => score::run(a),
        Command::Run(a) => run::run(a),
        Command::Data(a) => data::run(a),
        Command::Report(a) => report::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Merge(a) => merge::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Launch(a) => launch::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Devices(a) => devices::run(a),
        Command::Serve(a) => serve::run(a),
    };
    match result {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("candor: error: {err:#}");
            1
        }
    }
}
