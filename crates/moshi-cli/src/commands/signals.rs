//! SIGINT, SIGTERM and SIGHUP during a command that writes files. Outputs are written to hidden
//! temporary files and renamed into place only at the end (`moshi_loader::output_file`), so a
//! signal already leaves every destination as it was; this removes the temporary files too.
//!
//! The signal handler itself is tokio's (through `signal-hook-registry`): it only sets a flag and
//! writes a byte to a pipe, which is async-signal-safe. A thread of our own waits on that pipe and
//! does the work a handler must not do (a lock, file removals) in ordinary code: it removes the
//! registered temporary files (`remove_partials_for_exit`, which also stops any from being
//! created or renamed after), then ends the process as the signal would have (default action
//! restored, the signal raised again), so that a shell sees "killed by SIGINT".

use anyhow::Context;

/// Which signals end the command with its temporary files removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signals {
    /// SIGINT (Ctrl-C), SIGTERM and SIGHUP: commands with no stop of their own.
    All,
    /// SIGTERM and SIGHUP only: `chat` stops on Ctrl-C itself and completes its outputs.
    TermAndHup,
    /// SIGHUP only: `transcribe --mic` stops on Ctrl-C and SIGTERM itself and completes its
    /// outputs.
    Hup,
}

/// Starts the thread that waits for `signals` (see the module docs). Call it before the first
/// output is created.
#[cfg(unix)]
pub fn remove_partials_on(signals: Signals) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, Signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting tokio for signals")?;
    // Registered here, before returning: a signal from now on is caught.
    let (mut int, mut term, mut hup) = {
        let _entered = runtime.enter();
        let listen = |kind: SignalKind, name: &str| {
            signal(kind).with_context(|| format!("listening for {name}"))
        };
        (
            match signals {
                Signals::All => Some(listen(SignalKind::interrupt(), "SIGINT")?),
                Signals::TermAndHup | Signals::Hup => None,
            },
            match signals {
                Signals::All | Signals::TermAndHup => {
                    Some(listen(SignalKind::terminate(), "SIGTERM")?)
                }
                Signals::Hup => None,
            },
            listen(SignalKind::hangup(), "SIGHUP")?,
        )
    };
    std::thread::Builder::new()
        .name("moshi-signals".into())
        .spawn(move || {
            async fn next(s: &mut Option<Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            let number = runtime.block_on(async {
                tokio::select! {
                    _ = next(&mut int) => libc::SIGINT,
                    _ = next(&mut term) => libc::SIGTERM,
                    _ = hup.recv() => libc::SIGHUP,
                }
            });
            moshi_loader::output_file::remove_partials_for_exit();
            // SAFETY: plain libc calls on a valid signal number; restoring the default action and
            // raising the signal ends the process the way the signal itself would have.
            unsafe {
                libc::signal(number, libc::SIG_DFL);
                libc::raise(number);
            }
            std::process::exit(128 + number);
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Elsewhere the default actions stay (temporary files may be left on a signal).
#[cfg(not(unix))]
pub fn remove_partials_on(_signals: Signals) -> anyhow::Result<()> {
    Ok(())
}
