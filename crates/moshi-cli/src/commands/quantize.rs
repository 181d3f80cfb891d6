//! `moshi-rs quantize` (being implemented).

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {}

pub fn run(_args: QuantizeArgs) -> anyhow::Result<()> {
    anyhow::bail!("`moshi-rs quantize` is not available in this build yet")
}
