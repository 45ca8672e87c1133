//! `candor run` (to be written).

#[derive(Debug, clap::Args)]
pub struct RunArgs {}

pub fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("`candor run` is not available yet")
}
