//! `candor score refutebench` (to be written).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`candor score refutebench` is not available yet")
}
