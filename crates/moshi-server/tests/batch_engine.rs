//! The batched session engine with the tiny model: a reset session behaves exactly as a new one
//! and a clone of a new one is new, sessions of other settings over the same model leave it
//! unchanged, a
//! session's tokens equal an offline run's whether it runs alone or batched with others that
//! join and leave, sessions get their own sampling settings, one session too many is refused as
//! busy, and frames beyond the backlog are dropped and reported.

use moshi_loader::{ModelSource, SourceOverrides, WeightMode};
use moshi_model::generator::SamplingConfig;
use moshi_runtime::engine::{run_offline, DropPolicy, FrameOutput, FrameTokens};
use std::sync::Arc;
use std::time::Duration;

use moshi_runtime::pipeline::{self, MoshiModel, MoshiPipeline};
use moshi_runtime::FRAME_SAMPLES;
use moshi_server::batch_engine::BatchEngine;
use moshi_server::session_engine::{OpenError, SessionEngine, SessionEvent, SessionSettings};
use moshi_test_support::tiny_a_dir;

fn tiny_model() -> Arc<MoshiModel> {
    let model =
        ModelSource::resolve(tiny_a_dir().to_str().unwrap(), &SourceOverrides::default()).unwrap();
    Arc::new(MoshiModel::load(&model, WeightMode::Native, Default::default()).unwrap())
}

/// A session of a freshly loaded tiny model.
fn load(sampling: SamplingConfig) -> MoshiPipeline {
    session_of(&tiny_model(), sampling)
}

fn session_of(model: &Arc<MoshiModel>, sampling: SamplingConfig) -> MoshiPipeline {
    MoshiPipeline::new(
        model.clone(),
        &pipeline::SessionSettings::with_sampling(sampling),
    )
    .unwrap()
}

/// An engine over the tiny model whose sessions bring their own sampling.
fn engine(max_sessions: usize, policy: DropPolicy, queue_frames: usize) -> BatchEngine {
    let base = pipeline::SessionSettings::with_sampling(SamplingConfig::default());
    BatchEngine::new(tiny_model(), base, max_sessions, policy, queue_frames).unwrap()
}

fn speech() -> Vec<f32> {
    let audio = moshi_runtime::wav::read_mono(&tiny_a_dir().join("input.wav")).unwrap();
    audio.samples[..audio.samples.len() / FRAME_SAMPLES * FRAME_SAMPLES].to_vec()
}

fn noise(frames: usize) -> Vec<f32> {
    let mut x = 12345u32;
    (0..frames * FRAME_SAMPLES)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 8) as f32 / (1 << 24) as f32 - 0.5
        })
        .collect()
}

/// (pcm, tokens) of running `pipeline` over `pcm`.
fn run(pipeline: &mut MoshiPipeline, pcm: &[f32]) -> (Vec<f32>, Vec<FrameTokens>) {
    let mut tokens = Vec::new();
    let (out, _) = run_offline(pipeline, pcm, |_, o: &FrameOutput| {
        tokens.extend(o.tokens.clone())
    })
    .unwrap();
    (out, tokens)
}

#[test]
fn a_reset_session_behaves_as_a_new_one() {
    for sampling in [
        SamplingConfig::greedy(),
        SamplingConfig {
            seed: 99,
            ..SamplingConfig::default()
        },
    ] {
        let input = speech();
        let model = tiny_model();
        let mut fresh = session_of(&model, sampling.clone());
        let mut cloned = fresh.clone();
        let reference = run(&mut fresh, &input);
        assert!(!reference.1.is_empty());
        // A used pipeline, reset: same audio (bit for bit) and tokens.
        run(&mut fresh, &noise(25));
        fresh.reset();
        assert_eq!(run(&mut fresh, &input), reference, "{sampling:?}");
        // A clone of a new session is a new session.
        assert_eq!(run(&mut cloned, &input), reference, "{sampling:?}");
        // A session of other settings over the same model, then one of these: the same
        // conversation again (the model holds no session state).
        let other = SamplingConfig {
            seed: 7,
            ..SamplingConfig::default()
        };
        run(&mut session_of(&model, other), &noise(5));
        let mut again = session_of(&model, sampling.clone());
        assert_eq!(run(&mut again, &input), reference, "{sampling:?}");
    }
}

/// Tokens of one session fed `pcm` (every frame processed: lossless policy).
fn session_tokens(pool: &BatchEngine, sampling: SamplingConfig, pcm: &[f32]) -> Vec<FrameTokens> {
    let mut session = pool.open(SessionSettings { sampling }).unwrap();
    let frames = pcm.len() / FRAME_SAMPLES;
    for f in pcm.chunks_exact(FRAME_SAMPLES) {
        session.input.push(f.to_vec());
    }
    let mut tokens = Vec::new();
    while tokens.len() < frames {
        match session.events.blocking_recv() {
            Some(SessionEvent::Frame(f)) => {
                assert_eq!(f.pcm.len(), FRAME_SAMPLES);
                assert_eq!(f.input.len(), FRAME_SAMPLES);
                tokens.push(f.tokens.unwrap());
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    tokens
}

#[test]
fn sessions_are_fresh_conversations_with_their_own_settings() {
    let input = speech();
    let frames = input.len() / FRAME_SAMPLES;
    let pool = engine(1, DropPolicy::Lossless, frames + 1);
    let greedy = session_tokens(&pool, SamplingConfig::greedy(), &input);
    let offline = run(&mut load(SamplingConfig::greedy()), &input).1;
    assert_eq!(
        greedy, offline,
        "a session gives the tokens of an offline run"
    );
    // The next session: the same conversation again.
    assert_eq!(
        session_tokens(&pool, SamplingConfig::greedy(), &input),
        greedy
    );
    let seeded = |seed| SamplingConfig {
        seed,
        ..SamplingConfig::default()
    };
    let a = session_tokens(&pool, seeded(1), &input);
    assert_eq!(a, run(&mut load(seeded(1)), &input).1);
    assert_eq!(session_tokens(&pool, seeded(1), &input), a);
    assert_ne!(
        session_tokens(&pool, seeded(2), &input),
        a,
        "the seed is the session's"
    );
}

#[test]
fn one_session_too_many_is_busy_until_one_ends() {
    let pool = engine(
        2,
        DropPolicy::RealTime {
            max_backlog_frames: 2,
        },
        8,
    );
    let settings = || SessionSettings {
        sampling: SamplingConfig::greedy(),
    };
    let a = pool.open(settings()).unwrap();
    let b = pool.open(settings()).unwrap();
    assert_eq!(pool.active_sessions(), 2);
    assert!(matches!(
        pool.open(settings()),
        Err(OpenError::Busy { max_sessions: 2 })
    ));
    drop(a);
    let mut c = pool.open(settings()).expect("a slot is free again at once");
    // The new session works.
    c.input.push(vec![0.0; FRAME_SAMPLES]);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let answered = matches!(c.events.blocking_recv(), Some(SessionEvent::Frame(_)));
        let _ = tx.send(answered);
    });
    assert!(rx
        .recv_timeout(Duration::from_secs(30))
        .expect("no answer within 30 s"));
    drop(b);
}

#[test]
fn frames_beyond_the_backlog_are_dropped_and_reported() {
    let pool = engine(
        1,
        DropPolicy::RealTime {
            max_backlog_frames: 0,
        },
        4,
    );
    let mut s = pool
        .open(SessionSettings {
            sampling: SamplingConfig::greedy(),
        })
        .unwrap();
    // 40 frames at once: far more than the model takes at a time.
    for f in noise(40).chunks_exact(FRAME_SAMPLES) {
        s.input.push(f.to_vec());
    }
    let mut processed = 0;
    let mut reported = 0;
    while processed + reported < 40 {
        match s.events.blocking_recv() {
            Some(SessionEvent::Frame(_)) => processed += 1,
            Some(SessionEvent::InputDropped { total_frames }) => reported = total_frames,
            other => panic!("{other:?}"),
        }
    }
    assert!(reported > 0, "frames were dropped and reported");
    assert_eq!(
        processed + reported,
        40,
        "every frame is processed or counted"
    );
    assert_eq!(s.input.dropped_frames(), reported);
}

#[test]
fn sessions_at_once_each_get_their_offline_tokens() {
    // Four conversations on one engine, started one after another (so at different positions
    // when they share steps), each fed its whole input at once: every frame is processed in
    // batched steps with whoever has a frame waiting, and each session's tokens are its own
    // offline run's.
    let input = speech();
    let frames = input.len() / FRAME_SAMPLES;
    let engine = std::sync::Arc::new(engine(4, DropPolicy::Lossless, frames + 1));
    let seeded = |seed| SamplingConfig {
        seed,
        ..SamplingConfig::default()
    };
    let settings = [
        SamplingConfig::greedy(),
        seeded(1),
        seeded(2),
        SamplingConfig::greedy(),
    ];
    let sessions: Vec<_> = settings
        .iter()
        .enumerate()
        .map(|(i, sampling)| {
            let engine = engine.clone();
            let sampling = sampling.clone();
            let pcm = if i % 2 == 0 {
                input.clone()
            } else {
                noise(frames)
            };
            let handle = std::thread::spawn({
                let pcm = pcm.clone();
                move || session_tokens(&engine, sampling, &pcm)
            });
            std::thread::sleep(Duration::from_millis(150));
            (handle, pcm)
        })
        .collect();
    for ((handle, pcm), sampling) in sessions.into_iter().zip(settings) {
        let got = handle.join().unwrap();
        assert_eq!(
            got,
            run(&mut load(sampling.clone()), &pcm).1,
            "{sampling:?}"
        );
    }
    assert_eq!(engine.active_sessions(), 0, "every session has ended");
}

#[test]
fn sessions_with_frames_waiting_share_one_step() {
    // Three sessions whose frames all arrive within microseconds: the engine steps them
    // together (far fewer steps than session frames), and each gets an answer for every frame.
    let frames = 12;
    let engine = self::engine(3, DropPolicy::Lossless, frames + 1);
    let mut sessions: Vec<_> = (0..3)
        .map(|_| {
            engine
                .open(SessionSettings {
                    sampling: SamplingConfig::greedy(),
                })
                .unwrap()
        })
        .collect();
    let input = noise(frames);
    for f in input.chunks_exact(FRAME_SAMPLES) {
        for s in &sessions {
            s.input.push(f.to_vec());
        }
    }
    let mut answers = Vec::new();
    for s in &mut sessions {
        let mut tokens = Vec::new();
        while tokens.len() < frames {
            match s.events.blocking_recv() {
                Some(SessionEvent::Frame(f)) => tokens.push(f.tokens.unwrap()),
                other => panic!("unexpected event {other:?}"),
            }
        }
        answers.push(tokens);
    }
    assert!(
        answers.iter().all(|a| *a == answers[0]),
        "the same input gives the same tokens in every session"
    );
    let counters = engine.counters();
    assert_eq!(counters.session_frames(), 3 * frames as u64);
    assert!(
        counters.steps() < counters.session_frames(),
        "{} steps for {} session frames: the sessions were not batched",
        counters.steps(),
        counters.session_frames()
    );
}
