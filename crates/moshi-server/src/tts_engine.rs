//! The compute side of `/api/tts_streaming`: one thread runs every text-to-speech stream of a
//! TTS model, all the streams that can step in one batched LM step (the weights read once), as
//! fast as the model goes (speech is generated ahead of real time when it can be). A stream
//! steps when the text it may need has arrived (moshi-server's `is_active`: the next word and
//! the look-ahead's, or the end of the text) and its client has room for what the step makes;
//! otherwise it waits, and the others go on. Words are reported as moshi-server reports them:
//! each when the next one starts, from the step after its consumption to the step after the
//! next's, in seconds of 12.5 steps; the stream ends `max_delay` steps after the state machine's
//! end (the last frames flushed), with its last word.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use moshi_model::lm::conditioner::TensorCondition;
use moshi_model::tts::machine::Entry;
use moshi_model::tts::TtsSettings;
use moshi_runtime::pipeline::{MoshiModel, SessionSettings};
use moshi_runtime::speak::TtsSpeaker;

use crate::session_engine::{
    Doorbell, EngineSession, OpenError, SessionEngine, SessionSettings as AudioSessionSettings,
    Slot, Slots,
};

/// Events a stream's task may hold unread before the stream stops stepping.
const EVENT_CAPACITY: usize = 64;
/// Events one step may make (a frame, a word, and at the end the last word and `Done`).
const EVENTS_PER_STEP: usize = 4;
/// moshi-server clamps its PCM to this.
const PCM_LIMIT: f32 = 0.99;
/// Steps per second of the text stream.
const FRAME_RATE_HZ: f64 = 12.5;

/// What the engine tells a stream's task, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum TtsEvent {
    /// One frame of audio (1920 samples, 24 kHz).
    Audio(Vec<f32>),
    /// A word said, with its times.
    Word {
        text: String,
        start_s: f64,
        stop_s: f64,
    },
    /// Everything is said.
    Done,
    /// The model failed; the stream cannot go on.
    Failed(String),
}

/// A stream's request to the compute thread.
enum Command {
    Open {
        id: u64,
        speakers: Option<Arc<TensorCondition>>,
        events: tokio::sync::mpsc::Sender<TtsEvent>,
    },
    /// A new voice for a stream that has not started.
    Voice {
        id: u64,
        speakers: Option<Arc<TensorCondition>>,
    },
    Text {
        id: u64,
        entries: Vec<Entry>,
    },
    EndOfText {
        id: u64,
    },
    Close {
        id: u64,
    },
}

/// Runs every TTS stream of one model on one compute thread.
pub struct TtsEngine {
    commands: mpsc::Sender<Command>,
    doorbell: Arc<Doorbell>,
    slots: Slots,
    next_id: std::sync::atomic::AtomicU64,
}

/// An open stream. Dropping it ends the stream and frees its slot.
pub struct TtsStreamHandle {
    id: u64,
    commands: mpsc::Sender<Command>,
    doorbell: Arc<Doorbell>,
    _slot: Slot,
    pub events: tokio::sync::mpsc::Receiver<TtsEvent>,
}

impl TtsStreamHandle {
    /// Queues words to say.
    pub fn text(&self, entries: Vec<Entry>) {
        self.send(Command::Text {
            id: self.id,
            entries,
        });
    }

    /// Speaks with `speakers` instead of the voice it was opened with; only before any text
    /// (the caller's to check).
    pub fn voice(&self, speakers: Option<Arc<TensorCondition>>) {
        self.send(Command::Voice {
            id: self.id,
            speakers,
        });
    }

    /// No more text: the stream ends after its last word.
    pub fn end_of_text(&self) {
        self.send(Command::EndOfText { id: self.id });
    }

    fn send(&self, command: Command) {
        // A stopped thread is reported to the stream by its events channel closing.
        let _ = self.commands.send(command);
        self.doorbell.ring();
    }
}

impl Drop for TtsStreamHandle {
    fn drop(&mut self) {
        self.send(Command::Close { id: self.id });
    }
}

impl TtsEngine {
    /// Starts the compute thread for `model` (a TTS model): each stream with `settings`'
    /// sampling and caches, the state machine's `tts` settings, guidance strength `cfg_coef`;
    /// at most `max_sessions` at once.
    pub fn new(
        model: Arc<MoshiModel>,
        settings: SessionSettings,
        tts: TtsSettings,
        cfg_coef: f32,
        max_sessions: usize,
    ) -> std::io::Result<Self> {
        let (commands, rx) = mpsc::channel();
        let doorbell = Arc::new(Doorbell::default());
        let bell = doorbell.clone();
        let worker = Worker {
            model,
            settings,
            tts,
            cfg_coef,
            streams: HashMap::new(),
        };
        std::thread::Builder::new()
            .name("moshi-tts".into())
            .spawn(move || worker.run(rx, &bell))?;
        Ok(Self {
            commands,
            doorbell,
            slots: Slots::new(max_sessions),
            next_id: Default::default(),
        })
    }

    /// Opens a stream speaking with `speakers` ([`TtsSpeaker::speakers`]), or says why not.
    pub fn open(
        &self,
        speakers: Option<Arc<TensorCondition>>,
    ) -> Result<TtsStreamHandle, OpenError> {
        let slot = self.slots.take()?;
        let (tx, rx) = tokio::sync::mpsc::channel(EVENT_CAPACITY);
        let handle = TtsStreamHandle {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            commands: self.commands.clone(),
            doorbell: self.doorbell.clone(),
            _slot: slot,
            events: rx,
        };
        if self
            .commands
            .send(Command::Open {
                id: handle.id,
                speakers,
                events: tx,
            })
            .is_err()
        {
            return Err(OpenError::Unavailable(
                "the compute thread has stopped (see the server log)".into(),
            ));
        }
        self.doorbell.ring();
        Ok(handle)
    }
}

/// One stream on the compute thread.
struct Stream {
    speaker: TtsSpeaker,
    events: tokio::sync::mpsc::Sender<TtsEvent>,
    /// The text of every entry pushed and not yet reported, in order.
    words: VecDeque<String>,
    steps: usize,
    /// Steps at the last word's consumption (moshi-server's `prev_word_steps`).
    prev_word_steps: usize,
    consumed: usize,
}

impl Stream {
    /// moshi-server's `on_end_of_word`: the oldest word, from the last consumption to now.
    fn report_word(&mut self) {
        if let Some(text) = self.words.pop_front() {
            let _ = self.events.try_send(TtsEvent::Word {
                text,
                start_s: self.prev_word_steps as f64 / FRAME_RATE_HZ,
                stop_s: self.steps as f64 / FRAME_RATE_HZ,
            });
        }
    }

    /// Whether it may step now: its text is there and its task has room for the step's events.
    fn can_step(&self) -> bool {
        self.speaker.is_ready() && self.events.capacity() >= EVENTS_PER_STEP
    }
}

struct Worker {
    model: Arc<MoshiModel>,
    settings: SessionSettings,
    tts: TtsSettings,
    cfg_coef: f32,
    streams: HashMap<u64, Stream>,
}

impl Worker {
    fn run(mut self, commands: mpsc::Receiver<Command>, doorbell: &Doorbell) {
        loop {
            loop {
                match commands.try_recv() {
                    Ok(c) => self.command(c),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            if !self.step() {
                doorbell.wait(Duration::from_millis(50));
            }
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Open {
                id,
                speakers,
                events,
            } => match self.speaker(speakers) {
                Ok(speaker) => {
                    self.streams.insert(
                        id,
                        Stream {
                            speaker,
                            events,
                            words: VecDeque::new(),
                            steps: 0,
                            prev_word_steps: 0,
                            consumed: 0,
                        },
                    );
                }
                Err(e) => {
                    let _ = events.try_send(TtsEvent::Failed(e.to_string()));
                }
            },
            Command::Voice { id, speakers } => {
                if self.streams.get(&id).is_none_or(|s| s.steps != 0) {
                    return;
                }
                let made = self.speaker(speakers);
                let stream = self.streams.get_mut(&id).expect("checked above");
                match made {
                    Ok(speaker) => stream.speaker = speaker,
                    Err(e) => {
                        let _ = stream.events.try_send(TtsEvent::Failed(e.to_string()));
                    }
                }
            }
            Command::Text { id, entries } => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.words.extend(entries.iter().map(|e| e.text.clone()));
                    s.speaker.push(entries);
                }
            }
            Command::EndOfText { id } => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.speaker.finish_text();
                }
            }
            Command::Close { id } => {
                self.streams.remove(&id);
            }
        }
    }

    /// A new stream's speaker with the engine's settings.
    fn speaker(&self, speakers: Option<Arc<TensorCondition>>) -> moshi_runtime::Result<TtsSpeaker> {
        TtsSpeaker::new(
            &self.model,
            &self.settings,
            self.tts,
            speakers,
            self.cfg_coef,
        )
    }

    /// One batched step of the streams that can step; false if none could.
    fn step(&mut self) -> bool {
        let ids: Vec<u64> = self
            .streams
            .iter()
            .filter(|(_, s)| s.can_step())
            .map(|(&id, _)| id)
            .collect();
        if ids.is_empty() {
            return false;
        }
        let mut stepping: Vec<(u64, Stream)> = ids
            .iter()
            .filter_map(|id| Some((*id, self.streams.remove(id)?)))
            .collect();
        let results = {
            let mut speakers: Vec<&mut TtsSpeaker> =
                stepping.iter_mut().map(|(_, s)| &mut s.speaker).collect();
            TtsSpeaker::step_together(&self.model, &mut speakers)
        };
        let max_delay = self.model.lm_config().max_delay();
        for ((id, mut s), result) in stepping.into_iter().zip(results) {
            match result {
                Ok(frame) => {
                    s.steps += 1;
                    let consumed = s
                        .speaker
                        .lm()
                        .tts()
                        .map_or(0, |t| t.machine().consumption_times().len());
                    if consumed > s.consumed {
                        s.consumed = consumed;
                        if s.prev_word_steps > 0 {
                            s.report_word();
                        }
                        s.prev_word_steps = s.steps;
                    }
                    if let Some(mut pcm) = frame.and_then(|f| f.pcm) {
                        pcm.iter_mut()
                            .for_each(|x| *x = x.clamp(-PCM_LIMIT, PCM_LIMIT));
                        let _ = s.events.try_send(TtsEvent::Audio(pcm));
                    }
                    if flushed(&s.speaker, s.steps, max_delay) {
                        s.report_word();
                        let _ = s.events.try_send(TtsEvent::Done);
                        continue;
                    }
                    self.streams.insert(id, s);
                }
                Err(e) => {
                    let _ = s.events.try_send(TtsEvent::Failed(e.to_string()));
                }
            }
        }
        true
    }
}

/// Whether the stream is done: its text ended and `max_delay` more steps flushed its frames
/// (moshi-server's `end_step + delay_steps + final_padding + max_delay`).
fn flushed(speaker: &TtsSpeaker, steps: usize, max_delay: usize) -> bool {
    steps >= max_delay && speaker.is_finished_at(steps - max_delay)
}

/// A text-to-speech module's engine counts its streams as every module's does; its streams
/// take text, so they open through `/api/tts_streaming` ([`TtsEngine::open`]), never as audio
/// sessions.
impl SessionEngine for TtsEngine {
    fn open(&self, _settings: AudioSessionSettings) -> Result<EngineSession, OpenError> {
        Err(OpenError::Unavailable(
            "a text-to-speech model takes text: its streams open at /api/tts_streaming".into(),
        ))
    }

    fn max_sessions(&self) -> usize {
        self.slots.max()
    }

    fn active_sessions(&self) -> usize {
        self.slots.active()
    }
}
