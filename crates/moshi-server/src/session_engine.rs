//! The seam between the protocol and the model: a [`SessionEngine`] opens conversations; each
//! takes 1920-sample input frames (24 kHz mono) without ever blocking the caller and answers with
//! [`SessionEvent`]s on a bounded channel. Compute runs on the engine's own threads, never on
//! the async runtime. The engine is [`crate::batch_engine::BatchEngine`]: every session's state
//! over one shared set of weights, one batched step per 80 ms tick for the sessions with a frame
//! waiting.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use moshi_model::generator::SamplingConfig;
use moshi_runtime::engine::{DropPolicy, FrameTokens};
use moshi_runtime::FRAME_MS;

/// Weight of the newest frame in the running estimate of the model's time per frame.
const COMPUTE_ESTIMATE_WEIGHT: f64 = 0.25;

/// What a session asks of the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSettings {
    pub sampling: SamplingConfig,
}

/// One processed input frame.
#[derive(Debug, Clone)]
pub struct ProcessedFrame {
    /// The input frame the model processed (24 kHz mono, 1920 samples), handed back.
    pub input: Vec<f32>,
    /// Moshi's answer (24 kHz mono, 1920 samples).
    pub pcm: Vec<f32>,
    /// Words decoded in this frame.
    pub text: Option<String>,
    pub tokens: Option<FrameTokens>,
    /// Model time for this frame.
    pub compute_ms: f64,
    /// When the input frame was complete (its last sample queued for the model).
    pub input_complete_at: Instant,
}

/// What the engine tells a session, in order.
#[derive(Debug)]
pub enum SessionEvent {
    Frame(ProcessedFrame),
    /// Input frames were dropped because compute fell behind real time (total so far).
    InputDropped {
        total_frames: u64,
    },
    /// The model failed; the session cannot go on.
    Failed(String),
}

/// Why a session could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("the server is busy: all {max_sessions} session(s) are in use, try again later")]
    Busy { max_sessions: usize },
    #[error("the model is unavailable: {0}")]
    Unavailable(String),
}

/// Opens conversations.
pub trait SessionEngine: Send + Sync + 'static {
    /// Starts a conversation with its own state, or says why not. Never blocks for long.
    fn open(&self, settings: SessionSettings) -> Result<EngineSession, OpenError>;
    /// Most conversations at once.
    fn max_sessions(&self) -> usize;
    /// Conversations open now.
    fn active_sessions(&self) -> usize;
    /// What the compute thread measures, for `/metrics` (none: those metrics are left out).
    fn metrics(&self) -> Option<&crate::metrics::EngineMetrics> {
        None
    }
}

/// An open conversation. Dropping it ends the conversation and frees its slot.
pub struct EngineSession {
    pub input: FrameInput,
    pub events: tokio::sync::mpsc::Receiver<SessionEvent>,
}

/// An engine's session slots: at most `max` open at once, each held by a [`Slot`] until dropped.
#[derive(Debug)]
pub struct Slots {
    active: Arc<std::sync::atomic::AtomicUsize>,
    max: usize,
}

/// One taken slot; dropping it frees it.
#[derive(Debug)]
pub struct Slot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Slots {
    pub fn new(max: usize) -> Self {
        Self {
            active: Default::default(),
            max,
        }
    }

    /// A free slot, or `Busy`.
    pub fn take(&self) -> Result<Slot, OpenError> {
        use std::sync::atomic::Ordering;
        let max = self.max;
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| Slot(self.active.clone()))
            .map_err(|_| OpenError::Busy { max_sessions: max })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn active(&self) -> usize {
        self.active.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Wakes an engine's thread when one of its sessions has news (a frame, or its end), so one
/// thread can wait on many queues.
#[derive(Debug, Default)]
pub struct Doorbell {
    rung: Mutex<bool>,
    wake: Condvar,
}

impl Doorbell {
    pub fn ring(&self) {
        *self.rung.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.wake.notify_all();
    }

    /// Waits until the bell rings (at once if it rang since the last wait) or `timeout` passes;
    /// true if it rang.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let rung = self.rung.lock().unwrap_or_else(|p| p.into_inner());
        let (mut rung, _) = self
            .wake
            .wait_timeout_while(rung, timeout, |r| !*r)
            .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *rung)
    }
}

/// Frames waiting for the model, shared by the session (producer) and the engine (consumer).
///
/// With [`DropPolicy::RealTime`] `{ max_backlog_frames: B }` the backlog may add at most
/// `(B + 1) * 80 ms` of latency: frames wait as long as the model, at its recent pace, gets
/// through all of them within that time; beyond it the oldest are dropped and counted. When the
/// model takes 80 ms or more per frame this is the engine's rule (B frames behind the one being
/// processed); when it is faster, a burst of frames from the network (a client that stalled,
/// then sent what it had) is caught up instead of dropped.
pub struct InputQueue {
    state: Mutex<QueueState>,
    policy: DropPolicy,
    /// Hard bound on waiting frames, whatever the policy.
    capacity_frames: usize,
    /// Rung on every push and on close.
    doorbell: Arc<Doorbell>,
}

struct QueueState {
    /// Each frame with the moment it was queued.
    frames: VecDeque<(Vec<f32>, Instant)>,
    closed: bool,
    dropped_frames: u64,
    /// Running estimate of the model's time per frame (real time until measured).
    compute_ms_estimate: f64,
}

/// How many of `waiting_frames` (the next one included) to drop under `policy` when the model
/// takes about `compute_ms` a frame: see [`InputQueue`].
pub fn frames_to_drop(policy: DropPolicy, waiting_frames: usize, compute_ms: f64) -> usize {
    match policy {
        DropPolicy::Lossless => 0,
        DropPolicy::RealTime { max_backlog_frames } => {
            let budget_ms = (max_backlog_frames + 1) as f64 * FRAME_MS;
            let within_budget = (budget_ms / compute_ms.max(1.0)).floor() as usize;
            waiting_frames.saturating_sub(within_budget.max(max_backlog_frames + 1))
        }
    }
}

/// What [`InputQueue::try_pop`] finds.
pub enum TryPop {
    Frame(NextFrame),
    /// Nothing waiting now.
    Empty,
    /// The session has ended: no more frames.
    Closed,
}

/// What [`InputQueue::try_pop`] hands the engine.
pub struct NextFrame {
    pub frame: Vec<f32>,
    /// When it was queued (complete).
    pub queued_at: Instant,
    /// Frames dropped so far (by the policy or the bound), when that changed since the last pop.
    pub newly_dropped_total: Option<u64>,
}

impl InputQueue {
    /// A queue that applies `policy` when frames are taken, never holds more than
    /// `capacity_frames` (the oldest are dropped and counted), and rings `doorbell` on every push
    /// and on close (the engine's thread waits on the bell of all its sessions).
    pub fn new(policy: DropPolicy, capacity_frames: usize, doorbell: Arc<Doorbell>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(QueueState {
                frames: VecDeque::with_capacity(capacity_frames.max(1)),
                closed: false,
                dropped_frames: 0,
                compute_ms_estimate: FRAME_MS,
            }),
            policy,
            capacity_frames: capacity_frames.max(1),
            doorbell,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // The state stays consistent whatever a panicking holder did (plain pushes and pops).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a frame (never blocks for long).
    pub fn push(&self, frame: Vec<f32>) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        s.frames.push_back((frame, Instant::now()));
        while s.frames.len() > self.capacity_frames {
            s.frames.pop_front();
            s.dropped_frames += 1;
        }
        drop(s);
        self.doorbell.ring();
    }

    /// No more frames: wakes the engine, which then ends the conversation.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.frames.clear();
        drop(s);
        self.doorbell.ring();
    }

    /// The next frame if one waits, after dropping the oldest ones as the policy says.
    pub fn try_pop(&self, last_seen_dropped: u64) -> TryPop {
        let mut s = self.lock();
        if s.closed {
            TryPop::Closed
        } else if s.frames.is_empty() {
            TryPop::Empty
        } else {
            TryPop::Frame(self.take_next(&mut s, last_seen_dropped))
        }
    }

    /// Drops the oldest frames as the policy says and takes the next one (`s.frames` non-empty).
    fn take_next(&self, s: &mut QueueState, last_seen_dropped: u64) -> NextFrame {
        let drop_now = frames_to_drop(self.policy, s.frames.len(), s.compute_ms_estimate);
        for _ in 0..drop_now {
            s.frames.pop_front();
        }
        s.dropped_frames += drop_now as u64;
        let (frame, queued_at) = s.frames.pop_front().expect("checked non-empty");
        let newly_dropped_total =
            (s.dropped_frames != last_seen_dropped).then_some(s.dropped_frames);
        NextFrame {
            frame,
            queued_at,
            newly_dropped_total,
        }
    }

    /// Frames dropped so far.
    pub fn dropped_frames(&self) -> u64 {
        self.lock().dropped_frames
    }

    /// Frames waiting for the model now.
    pub fn waiting_frames(&self) -> usize {
        self.lock().frames.len()
    }

    /// The engine took `compute_ms` for the last frame (feeds the drop decision).
    pub fn record_compute_ms(&self, compute_ms: f64) {
        let mut s = self.lock();
        s.compute_ms_estimate += COMPUTE_ESTIMATE_WEIGHT * (compute_ms - s.compute_ms_estimate);
    }
}

/// The session's end of an [`InputQueue`]; dropping it closes the queue and runs `on_close`.
pub struct FrameInput {
    queue: Arc<InputQueue>,
    on_close: Option<Box<dyn FnOnce() + Send>>,
}

impl FrameInput {
    pub fn new(queue: Arc<InputQueue>, on_close: Box<dyn FnOnce() + Send>) -> Self {
        Self {
            queue,
            on_close: Some(on_close),
        }
    }

    /// Queues one 1920-sample frame for the model.
    pub fn push(&self, frame: Vec<f32>) {
        self.queue.push(frame);
    }

    /// Input frames dropped so far.
    pub fn dropped_frames(&self) -> u64 {
        self.queue.dropped_frames()
    }

    /// Frames pushed and not yet taken by the model (a client's back-pressure).
    pub fn waiting_frames(&self) -> usize {
        self.queue.waiting_frames()
    }
}

impl Drop for FrameInput {
    fn drop(&mut self) {
        self.queue.close();
        if let Some(f) = self.on_close.take() {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(v: f32) -> Vec<f32> {
        vec![v; 4]
    }

    fn queue(policy: DropPolicy, capacity_frames: usize) -> Arc<InputQueue> {
        InputQueue::new(policy, capacity_frames, Arc::new(Doorbell::default()))
    }

    /// The next frame, which the test knows is waiting.
    fn pop(q: &InputQueue, last_seen_dropped: u64) -> NextFrame {
        match q.try_pop(last_seen_dropped) {
            TryPop::Frame(next) => next,
            TryPop::Empty => panic!("no frame waiting"),
            TryPop::Closed => panic!("the queue is closed"),
        }
    }

    #[test]
    fn real_time_policy_drops_the_oldest_and_counts() {
        let q = queue(
            DropPolicy::RealTime {
                max_backlog_frames: 1,
            },
            10,
        );
        for i in 0..5 {
            q.push(frame(i as f32));
        }
        // 5 waiting, 1 may wait behind the next: frames 0..3 dropped, 3 processed, 4 left.
        let next = pop(&q, 0);
        assert_eq!(next.frame[0], 3.0);
        assert_eq!(next.newly_dropped_total, Some(3));
        let next = pop(&q, 3);
        assert_eq!(next.frame[0], 4.0);
        assert_eq!(next.newly_dropped_total, None);
        assert_eq!(q.dropped_frames(), 3);
    }

    #[test]
    fn a_burst_the_model_can_catch_up_with_is_kept() {
        let policy = DropPolicy::RealTime {
            max_backlog_frames: 2,
        };
        // 240 ms of backlog allowed: at 10 ms a frame, 24 frames fit; at 80 ms or more, 3.
        assert_eq!(frames_to_drop(policy, 10, 10.0), 0);
        assert_eq!(frames_to_drop(policy, 30, 10.0), 6);
        assert_eq!(frames_to_drop(policy, 10, 60.0), 6);
        assert_eq!(frames_to_drop(policy, 10, 80.0), 7);
        assert_eq!(frames_to_drop(policy, 10, 500.0), 7);
        assert_eq!(frames_to_drop(DropPolicy::Lossless, 10, 500.0), 0);

        let q = queue(policy, 16);
        for _ in 0..20 {
            q.record_compute_ms(10.0);
        }
        for i in 0..8 {
            q.push(frame(i as f32));
        }
        let next = pop(&q, 0);
        assert_eq!(next.frame[0], 0.0, "nothing dropped");
        assert_eq!(next.newly_dropped_total, None);
        // The model slows down: the backlog is cut to what it can process in 240 ms.
        for _ in 0..20 {
            q.record_compute_ms(120.0);
        }
        let next = pop(&q, 0);
        assert_eq!(next.frame[0], 5.0, "7 waiting, 3 kept");
        assert_eq!(next.newly_dropped_total, Some(4));
    }

    #[test]
    fn lossless_policy_keeps_frames_up_to_the_bound() {
        let q = queue(DropPolicy::Lossless, 3);
        for i in 0..5 {
            q.push(frame(i as f32));
        }
        assert_eq!(q.dropped_frames(), 2);
        let got: Vec<f32> = (0..3).map(|_| pop(&q, 2).frame[0]).collect();
        assert_eq!(got, vec![2.0, 3.0, 4.0]);
    }

    #[test]
    fn pushes_and_closing_ring_the_doorbell() {
        let bell = Arc::new(Doorbell::default());
        let q = InputQueue::new(DropPolicy::Lossless, 3, bell.clone());
        assert!(
            !bell.wait(std::time::Duration::from_millis(10)),
            "nothing happened yet"
        );
        assert!(matches!(q.try_pop(0), TryPop::Empty));
        q.push(frame(1.0));
        assert!(bell.wait(std::time::Duration::ZERO), "a push rings");
        assert_eq!(pop(&q, 0).frame[0], 1.0);
        // A waiting engine thread is woken when the session's input is dropped.
        let waiter_bell = bell.clone();
        let waiter =
            std::thread::spawn(move || waiter_bell.wait(std::time::Duration::from_secs(30)));
        std::thread::sleep(std::time::Duration::from_millis(50));
        let on_close_ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = on_close_ran.clone();
        let input = FrameInput::new(
            q.clone(),
            Box::new(move || flag.store(true, std::sync::atomic::Ordering::Relaxed)),
        );
        let woken_at = std::time::Instant::now();
        drop(input);
        assert!(waiter.join().unwrap(), "closing rings");
        assert!(woken_at.elapsed() < std::time::Duration::from_secs(20));
        assert!(on_close_ran.load(std::sync::atomic::Ordering::Relaxed));
        q.push(frame(2.0));
        assert!(
            matches!(q.try_pop(0), TryPop::Closed),
            "a closed queue takes no more frames"
        );
    }
}
