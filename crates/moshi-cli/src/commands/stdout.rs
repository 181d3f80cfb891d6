//! Standard output as an output like any other: it may be closed (`| head -1`), full
//! (`>/dev/full`) or a pipe. `print!` panics on a write error; what moshi-rs prints goes through
//! here instead. A closed stdout (EPIPE: the reader has taken what it wanted) ends a command that
//! only prints quietly, with status 0 ([`is_closed_stdout`]; `main` checks it), as ripgrep does; any
//! other error (ENOSPC) is a clean error naming stdout.
//!
//! What is printed may quote files, configs, tokenizers and the model's words: control
//! characters are written escaped ([`moshi_loader::escape`]), line breaks kept, so that nothing
//! read from a file reaches a terminal as an escape sequence.

use std::io::Write;

use moshi_loader::escape::{escape_controls_in_lines, is_unsafe_for_terminal};

/// Stdout's reader is gone (EPIPE).
#[derive(Debug)]
pub struct ClosedStdout;

impl std::fmt::Display for ClosedStdout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stdout was closed by its reader")
    }
}

impl std::error::Error for ClosedStdout {}

/// The error of a failed write of `text` to stdout: [`ClosedStdout`] for EPIPE, else the cause.
fn stdout_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(ClosedStdout)
    } else {
        anyhow::Error::new(e).context("cannot write to stdout")
    }
}

/// Writes `text` to stdout (control characters escaped, line breaks kept) and flushes it.
pub fn print(text: &str) -> anyhow::Result<()> {
    let text = escape_controls_in_lines(text);
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(stdout_error)
}

/// Writes `value` as pretty JSON and a line break to stdout. serde_json escapes C0 controls;
/// DEL, the C1 controls and the bidirectional formatting characters, which it writes raw, are
/// escaped here the JSON way (`\u009b`), so the document reads back the same.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(value)?;
    let mut text = String::with_capacity(json.len() + 1);
    for c in json.chars() {
        if c != '\n' && is_unsafe_for_terminal(c) {
            // Every such character is in the Basic Multilingual Plane: one \uXXXX escape.
            text += &format!("\\u{:04x}", c as u32);
        } else {
            text.push(c);
        }
    }
    text.push('\n');
    print(&text)
}

/// Whether `e` is (or was caused by) a closed stdout: `main` exits quietly with status 0.
pub fn is_closed_stdout(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<ClosedStdout>())
}

/// Words printed while a command's real work goes on (`file`): a stdout error never stops the
/// run, whose outputs are files; the printing stops at the first one, which [`Self::finish`]
/// reports once the outputs are in place (a closed stdout is no error).
#[derive(Default)]
pub struct Words {
    error: Option<std::io::Error>,
    /// Nothing is printed: stdout is one of the command's outputs (`/dev/stdout`).
    quiet: bool,
}

impl Words {
    /// Words that are not printed (stdout is an output: words would corrupt it).
    pub fn quiet() -> Self {
        Self {
            error: None,
            quiet: true,
        }
    }

    /// Prints `text` (control characters escaped, line breaks kept) unless a write already
    /// failed.
    pub fn print(&mut self, text: &str) {
        self.write(&escape_controls_in_lines(text));
    }

    /// Prints a word as a TSV line `start_s<TAB>end_s<TAB>word` (the word's controls escaped,
    /// the tabs kept).
    pub fn print_timed_word(&mut self, start_s: f64, end_s: f64, word: &str) {
        self.write(&super::transcript::tsv_line(start_s, end_s, word));
    }

    fn write(&mut self, text: &str) {
        if self.error.is_none() && !self.quiet {
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                self.error = Some(e);
            }
        }
    }

    /// The first write error, except a closed stdout.
    pub fn finish(self) -> anyhow::Result<()> {
        match self.error {
            Some(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(stdout_error(e)),
            _ => Ok(()),
        }
    }
}
