//! Kyutai's TTS state machine (`moshi/models/tts.py` `StateMachine.process`): the model samples
//! only WORD (a word starts next) or PAD; the machine decides what is fed. A WORD pops the next
//! entry and queues its tokens, fed one per step on the main text stream while PAD is forced;
//! the look-ahead stream carries the tokens of the word `second_stream_ahead` entries later, and
//! the WORD itself; padding is bounded below (`forced_padding`, `initial_padding`) and above
//! (`max_padding`, then WORD is forced). A WORD with no entry left ends the text (`end_step`).

use std::collections::VecDeque;

use crate::lm::embedding::ZERO_TOKEN;

/// The special text tokens of Kyutai's TTS (`TokenIds`).
pub const NEW_WORD: u32 = 0;
/// Start of the main speaker's turn.
pub const MAIN_SPEAKER: u32 = 1;
/// Start of the other speaker's turn.
pub const OTHER_SPEAKER: u32 = 2;

/// One word to say, or a pause (no tokens).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tokens: Vec<u32>,
    pub text: String,
    /// Steps of PAD forced after the entry is consumed.
    pub padding: usize,
}

/// The machine's parameters (`StateMachine`, `TTSModel.from_checkpoint_info`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MachineParams {
    /// Values per muxed stream (`text_card + 1`).
    pub mux_card: u32,
    pub pad: u32,
    pub second_stream_ahead: usize,
    pub max_padding: usize,
    pub initial_padding: usize,
}

/// A word as it was consumed: its text and the step it was popped at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumedWord {
    pub text: String,
    pub step: usize,
}

/// The state of one stream's text.
#[derive(Clone, Debug)]
pub struct TtsMachine {
    params: MachineParams,
    entries: VecDeque<Entry>,
    remaining_padding: usize,
    forced_padding: usize,
    queued: VecDeque<u32>,
    lookahead_queued: VecDeque<u32>,
    end_step: Option<usize>,
    consumption_times: Vec<usize>,
    transcript: Vec<ConsumedWord>,
    /// No more entries will come (the whole script was given, or the stream's end).
    text_complete: bool,
}

impl TtsMachine {
    pub fn new(params: MachineParams) -> Self {
        Self {
            params,
            entries: VecDeque::new(),
            remaining_padding: params.initial_padding,
            forced_padding: params.initial_padding,
            queued: VecDeque::new(),
            lookahead_queued: VecDeque::new(),
            end_step: None,
            consumption_times: Vec::new(),
            transcript: Vec::new(),
            text_complete: false,
        }
    }

    /// Back to the start: no entries, counters at their initial values.
    pub fn reset(&mut self) {
        *self = Self::new(self.params);
    }

    pub fn push(&mut self, entry: Entry) {
        self.entries.push_back(entry);
    }

    /// No more entries will be pushed.
    pub fn finish_text(&mut self) {
        self.text_complete = true;
    }

    pub fn is_text_complete(&self) -> bool {
        self.text_complete
    }

    /// Whether a step may run without guessing at text not given yet (moshi-server's
    /// `is_active`): the text is complete, or the next entry is a pause, or the next word and
    /// the `second_stream_ahead` words after it are there.
    pub fn is_ready(&self) -> bool {
        if self.text_complete {
            return true;
        }
        let Some(next) = self.entries.front() else {
            return false;
        };
        let ahead = self.params.second_stream_ahead;
        if ahead == 0 || next.tokens.is_empty() {
            return true;
        }
        self.entries.iter().filter(|e| !e.tokens.is_empty()).count() > ahead
    }

    /// The step at which a WORD found no entry left (the end of the text), if reached.
    pub fn end_step(&self) -> Option<usize> {
        self.end_step
    }

    /// Steps at which each entry was consumed.
    pub fn consumption_times(&self) -> &[usize] {
        &self.consumption_times
    }

    /// The words consumed so far, with their steps.
    pub fn transcript(&self) -> &[ConsumedWord] {
        &self.transcript
    }

    /// Entries not consumed yet.
    pub fn pending_entries(&self) -> usize {
        self.entries.len()
    }

    /// The text fed at the next step for the model's `token` sampled at `step` (muxed with the
    /// second stream where the model has one), and whether an entry was consumed.
    pub fn process(&mut self, step: usize, token: u32) -> (u32, bool) {
        let pad = self.params.pad;
        let mut token = if token == NEW_WORD || token == pad {
            token
        } else {
            pad
        };
        if !self.queued.is_empty() || self.forced_padding > 0 {
            token = pad;
        } else if self.remaining_padding == 0 {
            token = NEW_WORD;
        }
        let mut consumed = false;
        if token == NEW_WORD {
            (token, consumed) = self.consume(step);
        }
        let mut output = if token == pad {
            self.remaining_padding = self.remaining_padding.saturating_sub(1);
            self.forced_padding = self.forced_padding.saturating_sub(1);
            self.queued.pop_front().unwrap_or(pad)
        } else {
            NEW_WORD
        };
        if self.params.second_stream_ahead == 0 {
            return (output, consumed);
        }
        let second = if output == NEW_WORD {
            // The WORD goes on the second stream; the main one moves on to the word's tokens.
            output = self.queued.pop_front().unwrap_or(pad);
            Some(NEW_WORD)
        } else {
            self.lookahead_queued.pop_front()
        };
        debug_assert!(output != ZERO_TOKEN);
        let second_plus_one = second.map_or(0, |s| s + 1);
        (second_plus_one * self.params.mux_card + output, consumed)
    }

    /// A WORD at `step`: pops the next entry (its tokens queued, the look-ahead's queued, the
    /// padding counters set) or, with none left, ends the text. The token it becomes, and
    /// whether an entry was consumed.
    fn consume(&mut self, step: usize) -> (u32, bool) {
        let pad = self.params.pad;
        let Some(entry) = self.entries.pop_front() else {
            if self.end_step.is_none() {
                self.end_step = Some(step);
                if self.params.second_stream_ahead > 0 {
                    return (NEW_WORD, false);
                }
            }
            return (pad, false);
        };
        self.consumption_times.push(step);
        let token = if entry.tokens.is_empty() {
            // A pause: the WORD reads as PAD.
            pad
        } else {
            self.transcript.push(ConsumedWord {
                text: entry.text.clone(),
                step,
            });
            self.queued.extend(&entry.tokens);
            if self.params.second_stream_ahead > 0 {
                let ahead = self.tokens_ahead(self.params.second_stream_ahead);
                self.lookahead_queued.extend(ahead);
            }
            self.remaining_padding = self.params.max_padding;
            NEW_WORD
        };
        self.forced_padding = entry.padding;
        (token, true)
    }

    /// The tokens of the `lookahead`-th word entry still pending (`State.get_tokens_ahead`).
    fn tokens_ahead(&self, lookahead: usize) -> Vec<u32> {
        self.entries
            .iter()
            .filter(|e| !e.tokens.is_empty())
            .nth(lookahead - 1)
            .map(|e| e.tokens.clone())
            .unwrap_or_default()
    }
}
