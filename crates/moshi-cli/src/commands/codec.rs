//! `moshi-rs codec` (being implemented).

#[derive(clap::Subcommand, Debug)]
pub enum CodecCommand {}

pub fn run(cmd: CodecCommand) -> anyhow::Result<()> {
    match cmd {}
}
