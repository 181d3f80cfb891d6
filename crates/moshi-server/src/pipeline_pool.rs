//! A [`SessionEngine`] over a fixed pool of processors (one loaded [`MoshiPipeline`] per
//! session slot, `--max-sessions` of them), each on its own compute thread. A conversation
//! takes a free slot; when it ends the slot's processor is reset to its freshly loaded state
//! before the next conversation starts on it. Until the model's weights can be shared between
//! sessions, this is what lets several people talk at once.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use moshi_runtime::engine::{DropPolicy, FrameProcessor};
use moshi_runtime::pipeline::MoshiPipeline;
use tokio::sync::mpsc::error::TrySendError;

use crate::session_engine::{
    EngineSession, FrameInput, InputQueue, OpenError, ProcessedFrame, SessionEngine, SessionEvent,
    SessionSettings,
};

/// Events a session may leave unread before further ones are dropped (about 5 s of frames).
pub const EVENT_CAPACITY: usize = 64;

/// A frame processor that can hold one conversation at a time.
pub trait ConversationProcessor: FrameProcessor {
    /// Starts a conversation with these settings, from the freshly loaded state.
    fn begin(&mut self, settings: &SessionSettings);
    /// Forgets the conversation: afterwards the processor behaves as freshly loaded.
    fn end(&mut self);
}

impl ConversationProcessor for MoshiPipeline {
    fn begin(&mut self, settings: &SessionSettings) {
        self.set_sampling(settings.sampling.clone());
    }

    fn end(&mut self) {
        self.reset();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Live,
    /// Its processor panicked: never used again.
    Retired,
}

struct Assignment {
    settings: SessionSettings,
    queue: Arc<InputQueue>,
    events: tokio::sync::mpsc::Sender<SessionEvent>,
}

/// One processor per slot, each on its own thread.
pub struct PipelinePool {
    states: Arc<Mutex<Vec<SlotState>>>,
    slots: Vec<mpsc::Sender<Assignment>>,
    policy: DropPolicy,
    queue_capacity_frames: usize,
}

fn lock_states(states: &Mutex<Vec<SlotState>>) -> std::sync::MutexGuard<'_, Vec<SlotState>> {
    states.lock().unwrap_or_else(|p| p.into_inner())
}

impl PipelinePool {
    /// Starts one compute thread per processor. `policy` decides which input frames are dropped
    /// when compute falls behind; at most `queue_capacity_frames` frames ever wait.
    pub fn new<P: ConversationProcessor + 'static>(
        processors: Vec<P>,
        policy: DropPolicy,
        queue_capacity_frames: usize,
    ) -> std::io::Result<Self> {
        let states = Arc::new(Mutex::new(vec![SlotState::Free; processors.len()]));
        let mut slots = Vec::with_capacity(processors.len());
        for (index, processor) in processors.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            let states = states.clone();
            std::thread::Builder::new()
                .name(format!("moshi-session-{index}"))
                .spawn(move || slot_loop(index, processor, rx, states))?;
            slots.push(tx);
        }
        Ok(Self {
            states,
            slots,
            policy,
            queue_capacity_frames,
        })
    }
}

impl SessionEngine for PipelinePool {
    fn open(&self, settings: SessionSettings) -> Result<EngineSession, OpenError> {
        let mut states = lock_states(&self.states);
        let Some(index) = states.iter().position(|s| *s == SlotState::Free) else {
            return Err(if states.contains(&SlotState::Live) {
                OpenError::Busy {
                    max_sessions: self.slots.len(),
                }
            } else {
                OpenError::Unavailable("every model slot failed (see the server log)".into())
            });
        };
        let queue = InputQueue::new(self.policy, self.queue_capacity_frames);
        let (tx, rx) = tokio::sync::mpsc::channel(EVENT_CAPACITY);
        let assignment = Assignment {
            settings,
            queue: queue.clone(),
            events: tx,
        };
        if self.slots[index].send(assignment).is_err() {
            states[index] = SlotState::Retired;
            return Err(OpenError::Unavailable(format!(
                "model slot {index} has stopped"
            )));
        }
        states[index] = SlotState::Live;
        let states_for_close = self.states.clone();
        let on_close = Box::new(move || {
            let mut states = lock_states(&states_for_close);
            if states[index] == SlotState::Live {
                states[index] = SlotState::Free;
            }
        });
        Ok(EngineSession {
            input: FrameInput::new(queue, on_close),
            events: rx,
        })
    }

    fn max_sessions(&self) -> usize {
        self.slots.len()
    }

    fn active_sessions(&self) -> usize {
        lock_states(&self.states)
            .iter()
            .filter(|s| **s == SlotState::Live)
            .count()
    }
}

fn slot_loop<P: ConversationProcessor>(
    index: usize,
    mut processor: P,
    assignments: mpsc::Receiver<Assignment>,
    states: Arc<Mutex<Vec<SlotState>>>,
) {
    while let Ok(assignment) = assignments.recv() {
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
            converse(&mut processor, assignment);
        }));
        let reset = std::panic::catch_unwind(AssertUnwindSafe(|| processor.end()));
        if ran.is_err() || reset.is_err() {
            tracing::error!(
                slot = index,
                "the model panicked during a conversation; this session slot is retired"
            );
            lock_states(&states)[index] = SlotState::Retired;
            return;
        }
    }
}

/// Runs one conversation until its input closes or the model fails.
fn converse<P: ConversationProcessor>(processor: &mut P, a: Assignment) {
    processor.begin(&a.settings);
    let mut dropped_seen = 0;
    let mut events_lost = 0u64;
    let mut send = |event: SessionEvent| match a.events.try_send(event) {
        Ok(()) => true,
        Err(TrySendError::Full(_)) => {
            events_lost += 1;
            if events_lost.is_power_of_two() {
                tracing::warn!(
                    events_lost,
                    "a session does not take its frames: its oldest unread answers are kept, new ones dropped"
                );
            }
            true
        }
        Err(TrySendError::Closed(_)) => false,
    };
    while let Some(next) = a.queue.pop(dropped_seen) {
        if let Some(total) = next.newly_dropped_total {
            dropped_seen = total;
            if !send(SessionEvent::InputDropped {
                total_frames: total,
            }) {
                return;
            }
        }
        let t0 = Instant::now();
        let event = match processor.process_frame(&next.frame) {
            Ok(out) => {
                let compute_ms = t0.elapsed().as_secs_f64() * 1e3;
                a.queue.record_compute_ms(compute_ms);
                SessionEvent::Frame(ProcessedFrame {
                    input: next.frame,
                    pcm: out.pcm,
                    text: out.text,
                    tokens: out.tokens,
                    compute_ms,
                    input_complete_at: next.queued_at,
                })
            }
            Err(e) => {
                send(SessionEvent::Failed(e.to_string()));
                return;
            }
        };
        if !send(event) {
            return;
        }
    }
}
