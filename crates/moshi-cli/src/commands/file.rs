//! `moshi-rs file` (being implemented).

#[derive(clap::Args, Debug)]
pub struct FileArgs {}

pub fn run(_args: FileArgs) -> anyhow::Result<()> {
    anyhow::bail!("`moshi-rs file` is not available in this build yet")
}
