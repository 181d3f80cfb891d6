//! The outputs of a command, checked together before any work: each one against every input of
//! the run (the WAV, every file of the model, configs) and against every other output, and each
//! one writable. Every command that writes files (`file`, `codec`, `quantize`, `bench`, `chat`)
//! calls [`check_outputs`] once with all of them, so that a checkpoint can never be replaced by
//! a report and two flags can never race for one file. The writing itself is
//! `moshi_loader::output_file`'s.

use std::path::Path;

use anyhow::Context;
use moshi_loader::output_file::{check_output_path, ensure_distinct_outputs, ensure_not_an_input};

/// Fails, naming the flag, when one of `outputs` (flag or role, path) is one of `inputs`, cannot
/// be written (missing folder, a directory, read-only), or names the same file as another output.
pub fn check_outputs(outputs: &[(&str, &Path)], inputs: &[&Path]) -> anyhow::Result<()> {
    for (what, path) in outputs {
        ensure_not_an_input(path, inputs).with_context(|| what.to_string())?;
        check_output_path(path).with_context(|| what.to_string())?;
    }
    ensure_distinct_outputs(outputs)?;
    Ok(())
}

/// The outputs among `flags` that were given, for [`check_outputs`].
pub fn given<'a>(flags: &[(&'a str, Option<&'a Path>)]) -> Vec<(&'a str, &'a Path)> {
    flags
        .iter()
        .filter_map(|(what, p)| p.map(|p| (*what, p)))
        .collect()
}
