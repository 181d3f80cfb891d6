//! `moshi-rs transcribe --mic`: live captions from the microphone, through the real-time
//! runtime `chat` runs on (cpal capture, the mic ring, the engine thread converting to 24 kHz
//! and running the pipeline on every 80 ms frame, frames dropped and counted when the model
//! falls behind; [`super::live`]), capture only: no output device is opened.
//!
//! The stream is fed as `transcribe FILE` feeds a file ([`SttStream`]): the model's silence
//! prefix here before listening starts, the microphone's frames on the engine's thread, and, at
//! the end (Ctrl-C, SIGTERM, `--duration-s`), once the engine has processed the frames already
//! captured, the silence that flushes the text's delay here again, on the pipeline the engine
//! hands back, so that the words still in flight are printed and written. Words are printed on
//! stdout as they complete (start, end in seconds since listening started, word), with a status
//! line on stderr when it is a terminal: the end-of-turn probability, the real-time factor and
//! the audio counters. `--record-input` keeps exactly the frames the model was fed:
//! `transcribe` on that file gives the same steps and words.

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use moshi_loader::output_file::names_stdout;
use moshi_model::stt::TimedWord;
use moshi_runtime::backend::cpal::CpalBackend;
use moshi_runtime::backend::{start_session, AudioBackend, RingSizes, Session};
use moshi_runtime::engine::{
    EngineEvent, EngineHandle, EngineReport, FrameRecorder, OfflineRunner,
};
use moshi_runtime::metrics::Metrics;
use moshi_runtime::pipeline::{MoshiModel, MoshiPipeline};
use moshi_runtime::recorder::FedInputWav;
use moshi_runtime::ring::{AudioCounters, CounterSnapshot};
use moshi_runtime::transcribe::{SttStream, TranscribedStep};
use moshi_runtime::FRAME_MS;

use super::live::{
    device_samples_ms, frames_ms, run_until_stop, watch_stop_signals, DeviceErrorReports, Devices,
    Stop, Watch,
};
use super::outputs::check_outputs;
use super::signals::{remove_partials_on, Signals};
use super::stdout::Words;
use super::transcribe::{
    end_of_turn, load_stt_pipeline, outputs_of, StepOutputs, TranscribeArgs, DEFAULT_STT_REPO,
    END_OF_TURN_THRESHOLD,
};

/// Decoded text the status line shows (the latest characters).
const STATUS_TEXT_CHARS: usize = 50;
/// Frames the status line's real-time factor averages.
const RECENT_FRAMES: usize = 25;

/// What the captions print and write as the steps come.
struct Captions {
    outputs: StepOutputs,
    printed: Words,
    /// stderr is a terminal: a status line redrawn in place.
    tty: bool,
    last_status: Instant,
    end_of_turn: Option<f32>,
    /// The latest decoded text, for the status line.
    recent_text: VecDeque<char>,
    /// Compute time of the latest frames the engine ran.
    recent_total_ms: VecDeque<f64>,
    device_errors: DeviceErrorReports,
    /// Every step's record (prefix, microphone, suffix): `--profile`'s summary.
    metrics: Metrics,
}

impl Captions {
    fn new(args: &TranscribeArgs, stdout_is_an_output: bool) -> anyhow::Result<Self> {
        Ok(Self {
            outputs: StepOutputs::create(args)?,
            printed: if stdout_is_an_output {
                Words::quiet()
            } else {
                Words::default()
            },
            tty: std::io::stderr().is_terminal(),
            last_status: Instant::now() - Duration::from_secs(3600),
            end_of_turn: None,
            recent_text: VecDeque::with_capacity(STATUS_TEXT_CHARS + 1),
            recent_total_ms: VecDeque::with_capacity(RECENT_FRAMES + 1),
            device_errors: DeviceErrorReports::default(),
            metrics: Metrics::default(),
        })
    }

    /// One step of the stream: its outputs, its words printed, the status line's state.
    fn step(&mut self, s: &TranscribedStep<'_>) -> anyhow::Result<()> {
        self.outputs.step(s)?;
        self.metrics.push(s.record);
        if let Some(text) = s.text {
            for c in text.chars() {
                self.recent_text
                    .push_back(if c.is_control() { ' ' } else { c });
                if self.recent_text.len() > STATUS_TEXT_CHARS {
                    self.recent_text.pop_front();
                }
            }
        }
        if let Some(p) = end_of_turn(s.tokens) {
            self.end_of_turn = Some(p);
        }
        self.print_words(s.words);
        Ok(())
    }

    /// Words on stdout, one a line: start and end (seconds since listening started), the word.
    fn print_words(&mut self, words: &[TimedWord]) {
        if words.is_empty() {
            return;
        }
        if self.tty {
            eprint_raw!("\r\x1b[2K");
            // Redrawn at the next status.
            self.last_status = Instant::now() - Duration::from_secs(3600);
        }
        for w in words {
            self.printed.print_timed_word(w.start_s, w.end_s, &w.text);
        }
    }

    /// The status line: every 250 ms in place on a terminal, else a line every 2 s.
    fn status(&mut self, counters: &AudioCounters) {
        let c = counters.snapshot();
        self.device_errors.report(c.device_errors, self.tty);
        let every = if self.tty {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(2)
        };
        if self.last_status.elapsed() < every {
            return;
        }
        self.last_status = Instant::now();
        let rtf = if self.recent_total_ms.is_empty() {
            0.0
        } else {
            self.recent_total_ms.iter().sum::<f64>() / self.recent_total_ms.len() as f64 / FRAME_MS
        };
        let turn = self.end_of_turn.map_or(String::new(), |p| {
            let ended = if p > END_OF_TURN_THRESHOLD {
                " (ended)"
            } else {
                ""
            };
            format!("end of turn {p:.2}{ended} | ")
        });
        let status = format!(
            "[{turn}RTF {rtf:.2} | glitches {} | dropped frames {} | device errors {}]",
            c.audible_glitch_events(),
            c.engine_frames_dropped,
            c.device_errors
        );
        if self.tty {
            let text: String = self.recent_text.iter().collect();
            eprint_raw!("\r\x1b[2K");
            eprint!("{status} {}", text.trim_start());
        } else {
            eprintln!("{status}");
        }
    }
}

/// The transcription of a live run: the stream's feeding and words around the engine, and what
/// they print and write.
struct Transcription {
    model: Arc<MoshiModel>,
    stream: SttStream,
    runner: OfflineRunner,
    captions: Captions,
}

impl Transcription {
    /// The steps of the frames the engine has run since the last call.
    fn take_events(&mut self, engine: &EngineHandle) -> anyhow::Result<()> {
        while let Ok(event) = engine.events().try_recv() {
            let EngineEvent::Frame {
                record,
                text,
                tokens,
            } = event
            else {
                continue;
            };
            let captions = &mut self.captions;
            if captions.recent_total_ms.len() == RECENT_FRAMES {
                captions.recent_total_ms.pop_front();
            }
            captions.recent_total_ms.push_back(record.total_ms);
            self.stream
                .audio_step(&self.model, text.as_deref(), tokens.as_ref(), record, |s| {
                    captions.step(s)
                })?;
        }
        Ok(())
    }

    /// Waits for the engine to end (it runs the frames already captured, a bounded few),
    /// taking the steps of its last frames.
    fn take_last_events(&mut self, engine: &EngineHandle) -> anyhow::Result<()> {
        loop {
            // Read before the events: every event of an ended engine is then taken below.
            let finished = engine.is_finished();
            self.take_events(engine)?;
            if finished {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The delay's silence through the pipeline the engine handed back: the words still in
    /// flight, printed and written. Returns the captions, to be completed.
    fn flush(mut self, mut pipeline: MoshiPipeline) -> anyhow::Result<Captions> {
        let captions = &mut self.captions;
        let last = self
            .stream
            .feed_suffix_and_finish(&mut pipeline, &mut self.runner, |s| captions.step(s))?;
        self.captions.outputs.words(&last)?;
        self.captions.print_words(&last);
        Ok(self.captions)
    }
}

/// How listening ended: why, the engine's report and the audio counters, and the pipeline back
/// from the engine.
struct Listened {
    stop_reason: Stop,
    report: EngineReport,
    counters: CounterSnapshot,
    pipeline: MoshiPipeline,
}

pub fn run(args: &TranscribeArgs) -> anyhow::Result<()> {
    // Ctrl-C and SIGTERM end the listening and complete the outputs (below); SIGHUP ends the
    // process with no partial file left.
    remove_partials_on(Signals::Hup)?;
    let outputs = outputs_of(args)?;
    // Before the model loads: what cannot be written fails at once; against the model's files
    // once they are known.
    check_outputs(&outputs, &[])?;
    args.live.check()?;
    let model = args.model.resolve_or(DEFAULT_STT_REPO, "assets/tiny-stt")?;
    check_outputs(&outputs, &model.input_paths())?;
    let (model, mut pipeline) = load_stt_pipeline(&args.model, model, "chat")?;
    pipeline.warm_up().context("warm-up frame")?;
    let stream = SttStream::new(pipeline.model())?;
    eprintln!(
        "model: {} ({:?}); {} silence frames before listening, {} after (text delay {:.2} s)",
        model.lm_weights_path.display(),
        model.layout,
        stream.prefix_frames(),
        stream.feeding().suffix_frames,
        pipeline.model().lm_config().stt().delay_s(),
    );
    let devices = Devices {
        options: args.live.capture_only(),
        rings: RingSizes::default(),
    };
    let mut backend = devices.open()?;
    eprintln!("audio: {}", backend.describe());
    let recording = args
        .record_input
        .as_deref()
        .map(|p| FedInputWav::spawn(p, FedInputWav::QUEUE_FRAMES).map(|r| (p, r)))
        .transpose()
        .context("--record-input")?;
    let mut transcription = Transcription {
        model: pipeline.model().clone(),
        stream,
        runner: OfflineRunner::new(),
        captions: Captions::new(args, outputs.iter().any(|(_, p)| names_stdout(p)))?,
    };
    let t = &mut transcription;
    let captions = &mut t.captions;
    t.stream
        .feed_prefix(&mut pipeline, &mut t.runner, |s| captions.step(s))?;

    let session = start_session(
        &mut backend,
        Box::new(pipeline),
        args.live.drop_policy(),
        0.0,
        recording
            .as_ref()
            .map(|(_, r)| Box::new(r.queue()) as Box<dyn FrameRecorder>),
        devices.rings,
    )?;
    let listened = listen(args, session, &devices, &mut backend, &mut transcription)?;
    eprintln!("stopped: {}", listened.stop_reason);
    let captions = transcription.flush(listened.pipeline)?;
    let words_out = captions.outputs.words_out;
    let committed = captions.outputs.commit(&captions.metrics.summary());
    summarize(&listened.report, &listened.counters, &backend, words_out);
    // Whatever became of the other outputs, the recording is completed.
    let recorded = recording.map_or(Ok(()), |(path, r)| {
        super::live::finish_wav_recording("--record-input", path, r, |s| {
            format!("{s:.2} s fed to the model")
        })
    });
    committed.and(recorded).and(captions.printed.finish())
}

/// Listens until a stop signal, the duration or the engine ending, then stops the device and
/// lets the engine run the frames already captured (or stops it at once after an error).
fn listen(
    args: &TranscribeArgs,
    session: Session,
    devices: &Devices,
    backend: &mut CpalBackend,
    transcription: &mut Transcription,
) -> anyhow::Result<Listened> {
    let stop = watch_stop_signals(true)?;
    eprintln!(
        "listening{} (Ctrl-C to stop)",
        args.live
            .duration_s
            .map_or(String::new(), |d| format!(" for {d} s"))
    );
    let watch = Watch {
        session: &session,
        devices,
        duration_s: args.live.duration_s,
        stop: &stop,
        started: Instant::now(),
    };
    let stop_reason = run_until_stop(&watch, backend, |session| {
        transcription.take_events(&session.engine)?;
        transcription.captions.status(&session.counters);
        Ok(())
    });

    let stopped = backend.stop();
    match &stop_reason {
        Ok(Stop::Failed(_)) | Err(_) => session.engine.request_stop(),
        Ok(_) => session.engine.input_done(),
    }
    let taken = transcription.take_last_events(&session.engine);
    let joined = session.engine.join_with_processor();
    if transcription.captions.tty {
        eprint_raw!("\r\x1b[2K");
    }
    if let Err(e) = stopped {
        eprintln!("warning: {e}");
    }
    let stop_reason = match stop_reason? {
        Stop::Failed(e) => return Err(e),
        reason => reason,
    };
    taken?;
    let (report, processor) = joined.context("the engine stopped with an error")?;
    let pipeline = MoshiPipeline::from_processor(processor)
        .context("the engine handed back another processor than the transcription's")?;
    Ok(Listened {
        stop_reason,
        report,
        counters: session.counters.snapshot(),
        pipeline,
    })
}

/// The end of listening: what was heard and the audio counters (as `chat` prints them).
fn summarize(report: &EngineReport, c: &CounterSnapshot, backend: &CpalBackend, words: usize) {
    let input = backend.input_format();
    let summary = report.metrics.summary();
    eprint!("{}", summary.to_table());
    eprintln!(
        "{words} words; frames: {} processed ({:.1} s heard), {} dropped",
        report.frames_processed,
        report.frames_processed as f64 * FRAME_MS / 1e3,
        report.frames_dropped,
    );
    eprintln!(
        "glitches: {} (mic ring overruns {} ({:.0} ms); device streams, below the callbacks: input lost {} ({:.0} ms), input inserted {}, capture buffer found full {}); device errors: {}",
        c.audible_glitch_events(),
        c.overrun_events,
        device_samples_ms(c.overrun_samples, input),
        c.input_lost_events,
        frames_ms(c.input_lost_frames, input.sample_rate_hz),
        c.input_inserted_events,
        c.input_buffer_full_events,
        c.device_errors,
    );
    if moshi_runtime::alloc_check::ENABLED {
        eprintln!(
            "allocations inside audio callbacks: {}",
            moshi_runtime::alloc_check::callback_allocations()
        );
    }
    if summary.real_time_factor > 1.0 || report.frames_dropped > 0 {
        eprintln!(
            "warning: the model is too slow for real time on this machine: real-time factor {:.2} (compute per 80 ms frame / 80 ms); \
             {} input frames were dropped to keep latency bounded (the words' times leave them out)",
            summary.real_time_factor, report.frames_dropped
        );
    }
}
