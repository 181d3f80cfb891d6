//! `moshi-rs inspect` (being implemented).

#[derive(clap::Args, Debug)]
pub struct InspectArgs {}

pub fn run(_args: InspectArgs) -> anyhow::Result<()> {
    anyhow::bail!("`moshi-rs inspect` is not available in this build yet")
}
