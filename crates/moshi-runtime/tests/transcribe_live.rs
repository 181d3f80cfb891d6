//! A speech-to-text model (the tiny-stt fixture) driven live as `moshi-rs transcribe --mic`
//! drives it, on the null backend instead of a device: the silence prefix fed before listening,
//! the frames run on the engine's thread (the fed frames recorded by `FedInputWav`), the
//! pipeline handed back by the engine at the end and the silence that flushes the text's delay
//! fed to it. Every step (fed chunk, text token, extra heads) and every word equal
//! `transcribe_frames` on the recording (stream == batch), and the flush yields the words still
//! in flight.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_model::mimi::MimiWeights;
use moshi_model::stt::TimedWord;
use moshi_runtime::backend::null::{NullBackend, NullClock, NullConfig};
use moshi_runtime::backend::{start_session, AudioBackend, RingSizes};
use moshi_runtime::engine::{DropPolicy, EngineEvent, EngineHandle, OfflineRunner};
use moshi_runtime::pipeline::{MoshiModel, MoshiPipeline, SessionSettings};
use moshi_runtime::recorder::FedInputWav;
use moshi_runtime::transcribe::{transcribe_frames, Fed, SttStream, TranscribedStep};
use moshi_runtime::wav_frames::{PartialFrame, WavFrames};
use moshi_runtime::{wav, RuntimeError, FRAME_SAMPLES, SAMPLE_RATE_HZ};
use moshi_test_support::{fixture, fixture_dir, path_str};

fn stt_pipeline() -> MoshiPipeline {
    let dir = fixture_dir("tiny-stt");
    let model = ModelSource::resolve(path_str(&dir), &SourceOverrides::default()).unwrap();
    let model = MoshiModel::load(&model, WeightMode::Native, MimiWeights::F32).unwrap();
    MoshiPipeline::new(
        Arc::new(model),
        &SessionSettings::with_sampling(SamplingConfig::greedy()),
    )
    .unwrap()
}

/// What a step gave: (step, fed, text token, extra heads' bits, words).
type Step = (u64, Fed, u32, Vec<Vec<u32>>, Vec<TimedWord>);

fn step_of(s: &TranscribedStep<'_>) -> Step {
    let t = s.tokens.expect("a speech-to-text step has tokens");
    let heads = t
        .extra_heads
        .iter()
        .map(|h| h.iter().map(|x| x.to_bits()).collect())
        .collect();
    (s.step, s.fed, t.text, heads, s.words.to_vec())
}

/// Runs `input` (24 kHz mono) live through the engine on the null backend, in lockstep (no
/// frame dropped), recording the fed frames at `recording`; returns the steps and the last words.
fn live(input: Vec<f32>, recording: &Path) -> (Vec<Step>, Vec<TimedWord>) {
    let mut pipeline = stt_pipeline();
    pipeline.warm_up().unwrap();
    let model = pipeline.model().clone();
    let mut stream = SttStream::new(&model).unwrap();
    let mut runner = OfflineRunner::new();
    let mut steps = Vec::new();
    let mut keep = |s: &TranscribedStep<'_>| -> Result<(), RuntimeError> {
        steps.push(step_of(s));
        Ok(())
    };
    stream
        .feed_prefix(&mut pipeline, &mut runner, &mut keep)
        .unwrap();
    let recorder = FedInputWav::spawn(recording, FedInputWav::QUEUE_FRAMES).unwrap();
    let mut backend = NullBackend::new(NullConfig::moshi(NullClock::Lockstep), input).unwrap();
    let session = start_session(
        &mut backend,
        Box::new(pipeline),
        DropPolicy::RealTime {
            max_backlog_frames: 2,
        },
        0.0,
        Some(Box::new(recorder.queue())),
        RingSizes::default(),
    )
    .unwrap();
    while !backend.input_finished() {
        std::thread::sleep(Duration::from_millis(2));
    }
    // As `transcribe --mic` ends: the device stops, the engine runs what was captured.
    backend.stop().unwrap();
    session.engine.input_done();
    take_until_finished(&session.engine, &mut stream, &model, &mut keep);
    let (report, processor) = session.engine.join_with_processor().unwrap();
    assert_eq!(report.frames_dropped, 0);
    assert_eq!(report.frames_processed, stream.audio_frames());
    let mut pipeline = MoshiPipeline::from_processor(processor).expect("the pipeline back");
    let last = stream
        .feed_suffix_and_finish(&mut pipeline, &mut runner, &mut keep)
        .unwrap();
    let recorded = recorder.finish(()).unwrap();
    assert_eq!(recorded.frames_dropped, 0);
    (steps, last)
}

/// The engine's frames as steps of `stream`, until the engine has ended.
fn take_until_finished(
    engine: &EngineHandle,
    stream: &mut SttStream,
    model: &MoshiModel,
    keep: &mut impl FnMut(&TranscribedStep<'_>) -> Result<(), RuntimeError>,
) {
    let t0 = Instant::now();
    loop {
        let finished = engine.is_finished();
        while let Ok(event) = engine.events().try_recv() {
            if let EngineEvent::Frame {
                record,
                text,
                tokens,
            } = event
            {
                stream
                    .audio_step(model, text.as_deref(), tokens.as_ref(), record, &mut *keep)
                    .unwrap();
            }
        }
        if finished {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the engine never ended"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `transcribe_frames` on `path`: its steps and last words.
fn batch(path: &Path) -> (Vec<Step>, Vec<TimedWord>) {
    let mut frames =
        WavFrames::open(path, SAMPLE_RATE_HZ, FRAME_SAMPLES, PartialFrame::Pad).unwrap();
    let mut steps = Vec::new();
    let (last, _) = transcribe_frames(&mut stt_pipeline(), &mut frames, |s| {
        steps.push(step_of(s));
        Ok::<_, RuntimeError>(())
    })
    .unwrap();
    (steps, last)
}

#[test]
fn live_steps_and_words_equal_the_transcription_of_the_fed_frames() {
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("fed.wav");
    // Speech after some silence that does not end on a frame boundary, as a microphone hears it.
    let speech = wav::read_mono(&fixture("tiny-stt", "input.wav"))
        .unwrap()
        .samples;
    let mut input = vec![0.0; 3 * FRAME_SAMPLES + 777];
    input.extend(&speech);
    let (live_steps, live_last) = live(input.clone(), &recording);

    // The recording holds exactly the whole frames heard (the engine leaves the partial last
    // frame unheard), bit for bit.
    let fed = wav::read_mono(&recording).unwrap().samples;
    let whole = input.len() / FRAME_SAMPLES * FRAME_SAMPLES;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&fed), bits(&input[..whole]));

    let (batch_steps, batch_last) = batch(&recording);
    assert_eq!(live_steps.len(), batch_steps.len());
    for (i, (l, b)) in live_steps.iter().zip(&batch_steps).enumerate() {
        assert_eq!(l, b, "step {i}");
    }
    assert_eq!(live_last, batch_last);

    // The stream ends with the delay's silence, and that flush completes words: without it,
    // they would be lost at the end of listening.
    let suffix: Vec<&Step> = live_steps
        .iter()
        .filter(|s| s.1 == Fed::SuffixSilence)
        .collect();
    assert_eq!(suffix.len(), 7, "0.5 s of delay at 12.5 steps per second");
    assert!(live_steps
        .iter()
        .rev()
        .take(7)
        .all(|s| s.1 == Fed::SuffixSilence));
    let flushed = suffix.iter().map(|s| s.4.len()).sum::<usize>() + live_last.len();
    let words = live_steps.iter().map(|s| s.4.len()).sum::<usize>() + live_last.len();
    assert!(
        flushed > 0,
        "no word came from the flush ({words} words in all)"
    );
}
