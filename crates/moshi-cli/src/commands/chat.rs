//! `moshi-rs chat` (being implemented).

#[derive(clap::Args, Debug)]
pub struct ChatArgs {}

pub fn run(_args: ChatArgs) -> anyhow::Result<()> {
    anyhow::bail!("`moshi-rs chat` is not available in this build yet")
}
