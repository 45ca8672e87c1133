//! `candor score realmistake` (to be written).

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`candor score realmistake` is not available yet")
}
