//! Standard output as an output like any other: it may be closed (`| head -1`), full
//! (`>/dev/full`) or a pipe. `print!` panics on a write error; what moshi-rs prints goes through
//! here instead. A closed stdout (EPIPE: the reader has taken what it wanted) ends a command that
//! only prints quietly, with status 0 ([`is_closed_stdout`]; `main` checks it), as ripgrep does; any
//! other error (ENOSPC) is a clean error naming stdout.

use std::io::Write;

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

/// Writes `text` to stdout and flushes it.
pub fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(stdout_error)
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

    /// Prints `text` unless a write already failed.
    pub fn print(&mut self, text: &str) {
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
