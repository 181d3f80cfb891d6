//! moshi-rs binary entry point: parses the command line and dispatches to one subcommand.

/// Messages on stderr never panic. `std`'s `eprintln!` panics when stderr cannot be written
/// (`2>/dev/full`, a closed pipe), which would end a run whose outputs are files over a lost
/// diagnostic (exit 101, the outputs never committed). These shadow `std`'s in the whole crate
/// (a `macro_rules!` defined before `mod commands` is in scope in every module of it).
///
/// Messages quote what files, configs and model folders hold (file names a config chose,
/// values, tensor names): their control characters are written escaped
/// ([`moshi_loader::escape`]), line breaks kept. `eprint_raw!` writes chat's own console
/// sequences (`\r`, erase line) as they are.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let message = format!($($arg)*);
        let _ = writeln!(
            std::io::stderr(),
            "{}",
            moshi_loader::escape::escape_controls_in_lines(&message)
        );
    }};
}

/// See [`eprintln!`].
macro_rules! eprint {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let message = format!($($arg)*);
        let _ = write!(
            std::io::stderr(),
            "{}",
            moshi_loader::escape::escape_controls_in_lines(&message)
        );
    }};
}

/// [`eprint!`] without escaping: for terminal control the program itself writes (chat's
/// console line), whose untrusted parts were escaped before.
macro_rules! eprint_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod commands;
mod log_json;

/// Debug builds count allocations made inside audio callbacks (`moshi-rs chat` reports them).
#[cfg(debug_assertions)]
#[global_allocator]
static ALLOCATOR: moshi_runtime::alloc_check::CountingAllocator =
    moshi_runtime::alloc_check::CountingAllocator;

use clap::{Parser, Subcommand};

/// Run Kyutai's Moshi speech-to-speech model on a CPU.
#[derive(Parser, Debug)]
#[command(name = "moshi-rs", version, about)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `moshi_model=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    /// Log lines as text, or as one JSON object each (for log collectors).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Describe a checkpoint file or model folder: format, dtype, bits, group size, parameters.
    Inspect(commands::inspect::InspectArgs),
    /// Mimi codec: WAV <-> codes.
    #[command(subcommand)]
    Codec(commands::codec::CodecCommand),
    /// Run the full streaming pipeline over a WAV file: Moshi answers it.
    File(commands::file::FileArgs),
    /// Live, full-duplex voice conversation on local audio devices.
    Chat(commands::chat::ChatArgs),
    /// Websocket server of Kyutai's protocol (/api/chat) with a web UI: talk from a browser.
    Serve(commands::serve::ServeArgs),
    /// List audio devices.
    Devices(commands::devices::DevicesArgs),
    /// Latency profiling against the 80 ms frame budget.
    Bench(commands::bench::BenchArgs),
    /// Quantize a bf16 checkpoint into an MLX-layout q4/q8 file.
    Quantize(commands::quantize::QuantizeArgs),
    /// Speech to text (Kyutai's STT models): the words of a WAV file with their times.
    Transcribe(commands::transcribe::TranscribeArgs),
    /// Text to speech (Kyutai's TTS models): say a text in a voice, into a WAV file.
    Speak(commands::speak::SpeakArgs),
}

fn main() -> std::process::ExitCode {
    let cli = match parse_command_line() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(&e),
    };
    let filter = match tracing_subscriber::EnvFilter::try_new(&cli.log) {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!(
                "error: --log `{}` is not a log filter ({e}); examples: `info`, `moshi_model=debug`",
                cli.log
            );
            return std::process::ExitCode::from(2);
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log file or collector gets plain lines, no escapes.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.event_format(log_json::JsonLines).init(),
    }
    // Compute threads: the performance cores of a big/little CPU, else every CPU
    // (moshi_kernels::cores), unless RAYON_NUM_THREADS says otherwise; `bench` sets its own
    // (--threads).
    if !matches!(cli.command, Command::Bench(_)) && std::env::var_os("RAYON_NUM_THREADS").is_none()
    {
        let threads = moshi_kernels::cores::default_compute_threads();
        if let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
        {
            tracing::warn!("cannot size the compute thread pool to {threads} threads: {e}");
        }
    }
    let result = match cli.command {
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Codec(a) => commands::codec::run(a),
        Command::File(a) => commands::file::run(a),
        Command::Chat(a) => commands::chat::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Devices(a) => commands::devices::run(a),
        Command::Bench(a) => commands::bench::run(a, &cli.log),
        Command::Quantize(a) => commands::quantize::run(a),
        Command::Transcribe(a) => commands::transcribe::run(a),
        Command::Speak(a) => commands::speak::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of stdout has what it wanted (`| head -1`): nothing to report.
        Err(e) if commands::stdout::is_closed_stdout(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Errors quote what files, configs and tokenizers hold (names, values, pieces):
            // their control characters are shown escaped, line breaks kept.
            let message = format!("{e:#}");
            eprintln!(
                "error: {}",
                moshi_loader::escape::escape_controls_in_lines(&message)
            );
            std::process::ExitCode::FAILURE
        }
    }
}

/// The command line, every flag's value allowed to be a negative number: `--cfg-coef -3` is then
/// refused by the flag's own range check naming the flag, not as "unexpected argument '-3'"
/// with a tip (`-- -3`) that does not work for a flag.
fn parse_command_line() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = negative_numbers_as_values(Cli::command()).try_get_matches()?;
    Cli::from_arg_matches(&matches)
}

fn negative_numbers_as_values(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| {
            if arg.get_action().takes_values() {
                arg.allow_negative_numbers(true)
            } else {
                arg
            }
        })
        .mut_subcommands(negative_numbers_as_values)
}

/// What clap's `Error::exit` does (help or version on stdout with status 0, a usage error on
/// stderr with status 2), except that a failed write is not ignored: `--help >/dev/full` is an
/// error, `--help | head -1` a quiet success.
fn clap_exit(e: &clap::Error) -> std::process::ExitCode {
    use std::io::Write;
    let printed = e.print().and_then(|()| {
        std::io::stdout().flush()?;
        std::io::stderr().flush()
    });
    let status = std::process::ExitCode::from(e.exit_code().clamp(0, 255) as u8);
    match printed {
        Ok(()) => status,
        // A usage error keeps its status whatever became of its message.
        Err(_) if e.use_stderr() => status,
        Err(w) if w.kind() == std::io::ErrorKind::BrokenPipe => std::process::ExitCode::SUCCESS,
        Err(w) => {
            eprintln!("error: cannot write to stdout: {w}");
            std::process::ExitCode::FAILURE
        }
    }
}
