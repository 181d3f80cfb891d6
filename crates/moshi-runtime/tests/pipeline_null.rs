//! The real Moshi pipeline (tiny-a model) driven live through the engine and the null backend,
//! faster than real time: the speaker stream equals file mode's output for the same input and
//! seed (sampling on, not greedy), with every frame accounted for, after the warm-up that `chat`
//! and `serve` run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_model::mimi::MimiWeights;
use moshi_runtime::backend::null::{NullBackend, NullClock, NullConfig};
use moshi_runtime::backend::{start_session, AudioBackend, RingSizes};
use moshi_runtime::engine::{run_offline, DropPolicy, EngineEvent, FrameProcessor, FrameRecorder};
use moshi_runtime::pipeline::{MoshiModel, MoshiPipeline, SessionSettings};
use moshi_runtime::{wav, FRAME_SAMPLES};
use moshi_test_support::{path_str, tiny_a, tiny_a_dir};

fn pipeline(seed: u64) -> MoshiPipeline {
    let model = ModelSource::resolve(path_str(&tiny_a_dir()), &SourceOverrides::default()).unwrap();
    let sampling = SamplingConfig {
        seed,
        ..SamplingConfig::default()
    };
    let model = MoshiModel::load(&model, WeightMode::Native, MimiWeights::F32).unwrap();
    MoshiPipeline::new(Arc::new(model), &SessionSettings::with_sampling(sampling)).unwrap()
}

#[test]
fn live_engine_with_tiny_model_equals_file_mode() {
    let input = wav::read_mono(&tiny_a("input.wav")).unwrap().samples;
    let frames = input.len() / FRAME_SAMPLES;
    let mut file_texts = Vec::new();
    let mut file_tokens = Vec::new();
    let (file_out, _) = run_offline(&mut pipeline(99), &input, |_, o| {
        file_texts.extend(o.text.clone());
        file_tokens.push(o.tokens.clone().unwrap());
    })
    .unwrap();
    // Sampling really is on: another seed gives other tokens.
    let mut other = pipeline(100);
    let other_tokens: Vec<_> = input
        .chunks_exact(FRAME_SAMPLES)
        .map(|f| other.process_frame(f).unwrap().tokens.unwrap())
        .collect();
    assert_ne!(other_tokens, file_tokens);

    // Warmed up as `chat` and `serve` do: one frame of silence, then back to a fresh state (RNG
    // included, or the sampled tokens below would differ).
    let mut live = pipeline(99);
    live.warm_up().unwrap();
    let mut backend =
        NullBackend::new(NullConfig::moshi(NullClock::Lockstep), input.clone()).unwrap();
    let kept_output = Arc::new(Mutex::new(Vec::new()));
    let session = start_session(
        &mut backend,
        Box::new(live),
        DropPolicy::RealTime {
            max_backlog_frames: 2,
        },
        0.0,
        Some(Box::new(KeptOutput(kept_output.clone()))),
        RingSizes::default(),
    )
    .unwrap();
    while !backend.finished() {
        std::thread::sleep(Duration::from_millis(2));
    }
    session.engine.input_done();
    let played = backend.stop().unwrap();
    let events: Vec<EngineEvent> =
        std::iter::from_fn(|| session.engine.events().try_recv().ok()).collect();
    let report = session.engine.join().unwrap();
    let c = session.counters.snapshot();

    assert_eq!(report.frames_processed as usize, frames);
    assert_eq!(report.frames_dropped, 0);
    assert_eq!((c.overrun_samples, c.underrun_samples), (0, 0));
    let startup = c.startup_silence_samples as usize;
    assert_eq!(
        &played[startup..startup + file_out.len()],
        &file_out[..],
        "live output != file output"
    );
    assert_eq!(*kept_output.lock().unwrap(), file_out, "recorded output");
    let mut live_tokens = Vec::new();
    let mut live_texts = Vec::new();
    let mut records = Vec::new();
    for e in events {
        if let EngineEvent::Frame {
            tokens,
            text,
            record,
        } = e
        {
            live_tokens.push(tokens.unwrap());
            live_texts.extend(text);
            records.push(record);
        }
    }
    assert_eq!(live_tokens, file_tokens);
    assert_eq!(live_texts, file_texts);
    // Every frame carries stage timings.
    assert_eq!(records.len() as u64, report.metrics.frames());
    assert!(records
        .iter()
        .all(|r| r.stages.mimi_encode_ms > 0.0 && r.stages.lm_temporal_ms > 0.0));
}

/// Keeps the output the engine records, for the assertions.
struct KeptOutput(Arc<Mutex<Vec<f32>>>);

impl FrameRecorder for KeptOutput {
    fn record(&mut self, _input: &[f32], output: &[f32]) {
        self.0.lock().unwrap().extend_from_slice(output);
    }
}
