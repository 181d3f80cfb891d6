//! `moshi-rs bench` (being implemented).

#[derive(clap::Args, Debug)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("`moshi-rs bench` is not available in this build yet")
}
