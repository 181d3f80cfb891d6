//! `moshi-rs devices` (being implemented).

#[derive(clap::Args, Debug)]
pub struct DevicesArgs {}

pub fn run(_args: DevicesArgs) -> anyhow::Result<()> {
    anyhow::bail!("`moshi-rs devices` is not available in this build yet")
}
