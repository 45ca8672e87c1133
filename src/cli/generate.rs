//! `candor generate` (to be written).

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {}

pub fn run(_args: GenerateArgs) -> anyhow::Result<()> {
    anyhow::bail!("`candor generate` is not available yet")
}
