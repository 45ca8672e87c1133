//! `candor setup` (to be written).

#[derive(Debug, clap::Args)]
pub struct SetupArgs {}

pub fn run(_args: SetupArgs) -> anyhow::Result<()> {
    anyhow::bail!("`candor setup` is not available yet")
}
