//! A [`SessionEngine`] that runs every open conversation through batched steps: one compute
//! thread holds the sessions (each a [`MoshiSession`] over the one shared [`MoshiModel`]) and,
//! as soon as a session has an input frame waiting, runs one step for every session with a frame
//! waiting ([`MoshiModel::step`]: the weights of the LM and of Mimi's transformers are read once
//! for all of them). Frames that arrive during a step wait for
//! the next one, so under load each step gathers every session (one weight pass per 80 ms frame
//! for all of them), and with compute to spare no frame waits for a tick. A session's answers
//! are those it would get alone, whoever shares its steps; sessions join and leave at any frame.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use moshi_runtime::engine::{DropPolicy, FrameOutput};
use moshi_runtime::pipeline::{self, MoshiModel, MoshiSession};
use tokio::sync::mpsc::error::TrySendError;

use crate::metrics::EngineMetrics;
use crate::session_engine::{
    Doorbell, EngineSession, FrameInput, InputQueue, OpenError, ProcessedFrame, SessionEngine,
    SessionEvent, SessionSettings, Slots, TryPop,
};

/// Events a session may leave unread before further ones are dropped (about 5 s of frames).
pub const EVENT_CAPACITY: usize = 64;

/// How long the idle compute thread sleeps between looks at its sessions when nothing rings
/// (a safety net: every frame, close and new session rings the doorbell).
const IDLE_LOOK: Duration = Duration::from_millis(200);

/// What the compute thread has done: batched steps run and the session frames they computed
/// (their ratio is the mean batch size).
#[derive(Debug, Default)]
pub struct StepCounters {
    steps: AtomicU64,
    session_frames: AtomicU64,
    /// Step times, batch sizes, queue depth and KV-cache bytes for `/metrics`.
    pub metrics: EngineMetrics,
}

impl StepCounters {
    /// Batched steps run so far.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Acquire)
    }

    /// Session frames computed so far (summed over the steps).
    pub fn session_frames(&self) -> u64 {
        self.session_frames.load(Ordering::Acquire)
    }
}

/// A new conversation handed to the compute thread.
struct Opening {
    settings: SessionSettings,
    queue: Arc<InputQueue>,
    events: tokio::sync::mpsc::Sender<SessionEvent>,
}

/// Runs every session in batched steps on one compute thread.
pub struct BatchEngine {
    openings: mpsc::Sender<Opening>,
    doorbell: Arc<Doorbell>,
    /// Sessions open now (counted from `open` to the drop of their input).
    slots: Slots,
    policy: DropPolicy,
    queue_capacity_frames: usize,
    counters: Arc<StepCounters>,
}

impl BatchEngine {
    /// Starts the compute thread. Each session is a new session of `model` with `base`'s
    /// settings and its own sampling (from its request). At most `max_sessions` at once; `policy` decides which input frames are dropped when compute
    /// falls behind; at most `queue_capacity_frames` frames ever wait per session.
    pub fn new(
        model: Arc<MoshiModel>,
        base: pipeline::SessionSettings,
        max_sessions: usize,
        policy: DropPolicy,
        queue_capacity_frames: usize,
    ) -> std::io::Result<Self> {
        let (openings, rx) = mpsc::channel();
        let doorbell = Arc::new(Doorbell::default());
        let bell = doorbell.clone();
        let counters = Arc::new(StepCounters::default());
        let scheduler = Scheduler::new(model, base, counters.clone());
        std::thread::Builder::new()
            .name("moshi-batch".into())
            .spawn(move || scheduler.run(rx, &bell))?;
        Ok(Self {
            openings,
            doorbell,
            slots: Slots::new(max_sessions),
            policy,
            queue_capacity_frames,
            counters,
        })
    }

    /// The compute thread's counters.
    pub fn counters(&self) -> &StepCounters {
        &self.counters
    }
}

impl SessionEngine for BatchEngine {
    fn open(&self, settings: SessionSettings) -> Result<EngineSession, OpenError> {
        let slot = self.slots.take()?;
        let on_close = Box::new(move || drop(slot));
        let queue = InputQueue::new(
            self.policy,
            self.queue_capacity_frames,
            self.doorbell.clone(),
        );
        let (tx, rx) = tokio::sync::mpsc::channel(EVENT_CAPACITY);
        let input = FrameInput::new(queue.clone(), on_close);
        let opening = Opening {
            settings,
            queue,
            events: tx,
        };
        if self.openings.send(opening).is_err() {
            // `input` is dropped here: the count goes back down.
            return Err(OpenError::Unavailable(
                "the compute thread has stopped (see the server log)".into(),
            ));
        }
        self.doorbell.ring();
        Ok(EngineSession { input, events: rx })
    }

    fn max_sessions(&self) -> usize {
        self.slots.max()
    }

    fn active_sessions(&self) -> usize {
        self.slots.active()
    }

    fn metrics(&self) -> Option<&EngineMetrics> {
        Some(&self.counters.metrics)
    }
}

/// One conversation on the compute thread.
struct Live {
    session: MoshiSession,
    queue: Arc<InputQueue>,
    events: tokio::sync::mpsc::Sender<SessionEvent>,
    dropped_seen: u64,
    events_lost: u64,
    /// Its client went away or it failed: removed after this pass.
    done: bool,
}

impl Live {
    /// Sends `event`; false once the session's receiver is gone. A full channel drops the
    /// event (the client does not read) and says so in the log now and then.
    fn send(&mut self, event: SessionEvent) -> bool {
        match self.events.try_send(event) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.events_lost += 1;
                if self.events_lost.is_power_of_two() {
                    tracing::warn!(
                        events_lost = self.events_lost,
                        "a session does not take its frames: its oldest unread answers are kept, new ones dropped"
                    );
                }
                true
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }
}

/// The compute thread's state.
struct Scheduler {
    model: Arc<MoshiModel>,
    base: pipeline::SessionSettings,
    sessions: Vec<Live>,
    counters: Arc<StepCounters>,
}

impl Scheduler {
    fn new(
        model: Arc<MoshiModel>,
        base: pipeline::SessionSettings,
        counters: Arc<StepCounters>,
    ) -> Self {
        Self {
            model,
            base,
            sessions: Vec::new(),
            counters,
        }
    }

    /// A new session for `o`, or its failure told to its client (settings the model refuses).
    fn admit(&mut self, o: Opening) {
        let settings = pipeline::SessionSettings {
            sampling: o.settings.sampling,
            ..self.base.clone()
        };
        let session = match self.model.new_session(&settings) {
            Ok(s) => s,
            Err(e) => {
                let _ = o.events.try_send(SessionEvent::Failed(e.to_string()));
                return;
            }
        };
        self.sessions.push(Live {
            session,
            queue: o.queue,
            events: o.events,
            dropped_seen: 0,
            events_lost: 0,
            done: false,
        });
    }

    /// Until the engine is dropped and the last session has ended.
    fn run(mut self, openings: mpsc::Receiver<Opening>, doorbell: &Doorbell) {
        loop {
            loop {
                match openings.try_recv() {
                    Ok(o) => self.admit(o),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) if self.sessions.is_empty() => return,
                    Err(mpsc::TryRecvError::Disconnected) => break,
                }
            }
            if self.sessions.is_empty() {
                self.publish_gauges();
                // Idle: wait for a conversation.
                match openings.recv() {
                    Ok(o) => self.admit(o),
                    Err(_) => return,
                }
                continue;
            }
            let stepped = self.step_ready_sessions();
            let before = self.sessions.len();
            self.sessions.retain(|s| !s.done);
            if stepped || self.sessions.len() != before {
                self.publish_gauges();
            }
            if !stepped {
                doorbell.wait(IDLE_LOOK);
            }
        }
    }

    /// The queue depth and KV-cache gauges of `/metrics` (a lock per session: once a step).
    fn publish_gauges(&self) {
        let waiting: usize = self.sessions.iter().map(|s| s.queue.waiting_frames()).sum();
        let kv_bytes: usize = self
            .sessions
            .iter()
            .map(|s| s.session.kv_cache_bytes())
            .sum();
        let m = &self.counters.metrics;
        m.waiting_input_frames
            .store(waiting as u64, Ordering::Relaxed);
        m.kv_cache_bytes.store(kv_bytes as u64, Ordering::Relaxed);
    }

    /// One batched step of every session with a frame waiting; false if none had one.
    fn step_ready_sessions(&mut self) -> bool {
        let mut ready = Vec::new();
        let mut frames = Vec::new();
        for (i, s) in self.sessions.iter_mut().enumerate() {
            if s.done {
                continue;
            }
            match s.queue.try_pop(s.dropped_seen) {
                TryPop::Closed => s.done = true,
                TryPop::Empty => {}
                TryPop::Frame(next) => {
                    if let Some(total) = next.newly_dropped_total {
                        s.dropped_seen = total;
                        if !s.send(SessionEvent::InputDropped {
                            total_frames: total,
                        }) {
                            s.done = true;
                            continue;
                        }
                    }
                    ready.push(i);
                    frames.push((next.frame, next.queued_at));
                }
            }
        }
        if ready.is_empty() {
            return false;
        }
        let t0 = Instant::now();
        let outputs = {
            // `ready` is ascending: a binary search keeps the gathering O(n log n) in the
            // sessions held, however many of them are idle.
            let mut sessions: Vec<&mut MoshiSession> = self
                .sessions
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| ready.binary_search(i).is_ok())
                .map(|(_, s)| &mut s.session)
                .collect();
            let inputs: Vec<pipeline::FrameInput> = frames
                .iter()
                .map(|(f, _)| pipeline::FrameInput::Pcm(f.as_slice()))
                .collect();
            let model = &self.model;
            std::panic::catch_unwind(AssertUnwindSafe(|| model.step(&mut sessions, &inputs)))
        };
        let step_s = t0.elapsed().as_secs_f64();
        let compute_ms = step_s * 1e3;
        self.counters.metrics.step_seconds.observe(step_s);
        self.counters.metrics.batch_size.observe(ready.len() as f64);
        self.counters.steps.fetch_add(1, Ordering::AcqRel);
        self.counters
            .session_frames
            .fetch_add(ready.len() as u64, Ordering::AcqRel);
        tracing::trace!(sessions = ready.len(), compute_ms, "batched step");
        let Ok(outputs) = outputs else {
            tracing::error!(
                sessions = ready.len(),
                "the model panicked during a batched step; its sessions are ended"
            );
            for &i in &ready {
                let s = &mut self.sessions[i];
                s.send(SessionEvent::Failed(
                    "internal error in the model (see the server log)".into(),
                ));
                s.done = true;
            }
            return true;
        };
        for ((i, (frame, queued_at)), output) in ready.into_iter().zip(frames).zip(outputs) {
            let s = &mut self.sessions[i];
            let event = match output {
                Ok(FrameOutput {
                    pcm, text, tokens, ..
                }) => {
                    // Every session in the step advanced one frame in `compute_ms`: that is
                    // its model's pace (the backlog rule's input).
                    s.queue.record_compute_ms(compute_ms);
                    SessionEvent::Frame(ProcessedFrame {
                        input: frame,
                        pcm,
                        text,
                        tokens,
                        compute_ms,
                        input_complete_at: queued_at,
                    })
                }
                Err(e) => {
                    s.done = true;
                    SessionEvent::Failed(e.to_string())
                }
            };
            if !s.send(event) {
                s.done = true;
            }
        }
        true
    }
}
