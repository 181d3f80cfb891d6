//! The audio-callback bodies must not allocate. This binary installs the counting allocator
//! and drives the exact callback functions the cpal backend uses, through the null backend and
//! a whole engine session; then it checks that the detector itself works.

use std::time::Duration;

use moshi_runtime::alloc_check::{callback_allocations, AudioCallbackGuard, CountingAllocator};
use moshi_runtime::backend::null::{NullBackend, NullClock, NullConfig};
use moshi_runtime::backend::{start_session, AudioBackend, RingSizes};
use moshi_runtime::continuity::{StreamContinuity, StreamSide};
use moshi_runtime::engine::{DropPolicy, FrameOutput, FrameProcessor};
use moshi_runtime::recorder::ConversationWav;
use moshi_runtime::ring::{
    capture_callback_converting, playback_callback_converting, sample_ring, AudioCounters,
};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Allocates on purpose (on the engine thread, which is allowed to).
struct Allocating;

impl FrameProcessor for Allocating {
    fn process_frame(&mut self, pcm_in: &[f32]) -> moshi_runtime::Result<FrameOutput> {
        Ok(FrameOutput {
            pcm: pcm_in.iter().map(|x| -x).collect(),
            text: Some("x".repeat(3)),
            ..Default::default()
        })
    }
}

#[test]
fn audio_callbacks_never_allocate() {
    // Constant per build, on purpose: a release-mode test build must fail here, not pass silently
    // (read through `black_box`, as a value the assertion checks at run time).
    assert!(
        std::hint::black_box(moshi_runtime::alloc_check::ENABLED),
        "run the tests in a debug/test profile with debug assertions"
    );
    let input: Vec<f32> = (0..24_000)
        .map(|i| ((i as f32) * 0.05).sin() * 0.3)
        .collect();
    let mut backend =
        NullBackend::new(NullConfig::moshi(NullClock::Paced { speed: 20.0 }), input).unwrap();
    // Recording on, as `chat --record` runs: its queue and thread are off the callbacks.
    let dir = tempfile::tempdir().unwrap();
    let recording = ConversationWav::spawn(&dir.path().join("rec.wav"), 4).unwrap();
    let session = start_session(
        &mut backend,
        Box::new(Allocating),
        DropPolicy::RealTime {
            max_backlog_frames: 1,
        },
        10.0,
        Some(Box::new(recording.queue())),
        RingSizes::default(),
    )
    .unwrap();
    while !backend.finished() {
        std::thread::sleep(Duration::from_millis(2));
    }
    session.engine.input_done();
    backend.stop().unwrap();
    let report = session.engine.join().unwrap();
    recording.finish(()).unwrap();
    let c = session.counters.snapshot();
    assert!(report.frames_processed >= 10);
    assert!(c.capture_callbacks >= 50 && c.playback_callbacks >= 50);

    // The integer-format variants (used for i16 devices), with underruns and overruns.
    let counters = AudioCounters::default();
    let (mut mic, _mic_c) = sample_ring(100);
    let (_spk_p, mut spk) = sample_ring(100);
    let mut scratch = vec![0f32; 64];
    let mut out16 = vec![0i16; 300];
    capture_callback_converting(
        &vec![1000i16; 300],
        &mut scratch,
        &mut mic,
        &counters,
        Some(5),
    );
    playback_callback_converting(&mut out16, &mut scratch, &mut spk, &counters, Some(5));
    assert!(counters.snapshot().overrun_samples > 0);

    // The device-stream watch the cpal callbacks run (clock steps, exhausted buffers), through
    // a glitch of each kind.
    for side in [StreamSide::Capture, StreamSide::Playback] {
        let mut watch = StreamContinuity::new(side, 24_000, 2.5, Some(480));
        let _guard = AudioCallbackGuard::enter();
        for i in 0..400u64 {
            let late_ns = if i >= 200 { 10_000_000 } else { 0 };
            let frames = if i == 200 || i == 300 { 480 } else { 120 };
            watch.observe(i * 5_000_000 + late_ns, frames, &counters);
        }
    }
    assert!(counters.snapshot().audible_glitch_events() >= 2);

    assert_eq!(
        callback_allocations(),
        0,
        "allocations inside audio callbacks"
    );

    // The detector works: an allocation inside a guarded section is counted.
    {
        let _guard = AudioCallbackGuard::enter();
        let v = std::hint::black_box(vec![1u8; 16]);
        drop(v);
    }
    assert!(
        callback_allocations() >= 1,
        "the allocation check did not see a deliberate allocation"
    );
}
