//! A speech-to-text model's text stream as the word events Kyutai's `moshi-server` streams to
//! its clients (`/api/asr-streaming`'s `Word` and `EndWord`), one token at a time.
//!
//! The events follow `moshi-server`'s rules (`moshi-core`'s `asr.rs`): the tokens above PAD
//! accumulate; the first PAD or end-of-padding (EPAD) after them completes the word, which starts
//! at the time of the EPAD before it; the next EPAD ends it. So a word's `Word` comes as soon as
//! it is complete and its `EndWord` when the next word begins (or a pause is marked).
//!
//! The times are the stream's own: a token of step `t` (0-based, one step per 80 ms frame of the
//! client's audio) is at `t / frame_rate - audio_delay_seconds`, the model's exact delay as
//! Kyutai's DSM scripts subtract it (moshi-server subtracts a whole number of steps from its own
//! TOML instead); tokens before the delay has passed (negative times) say nothing about the audio
//! and are skipped, as moshi-server skips its first steps.

use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::LmConfig;

use crate::stt::END_OF_PADDING_ID;
use crate::Result;

/// One event of the text stream.
#[derive(Clone, Debug, PartialEq)]
pub enum WordEvent {
    /// A word is complete: its text and the time it started.
    Word { text: String, start_s: f64 },
    /// The last word ended at this time.
    EndWord { stop_s: f64 },
}

/// Turns a speech-to-text model's text tokens into [`WordEvent`]s (see the module docs).
#[derive(Clone, Debug)]
pub struct WordEvents {
    /// `text_padding_token_id` (PAD), default 3.
    padding_id: u32,
    frame_rate: f64,
    delay_s: f64,
    /// Tokens seen.
    steps: u64,
    word_tokens: Vec<u32>,
    /// A `Word` was sent and its `EndWord` not yet.
    unended_word: bool,
    /// Time of the last EPAD: where the next word starts.
    last_stop_s: f64,
}

/// Tokens a word may hold before it is cut (a model stuck on text never grows memory).
const MAX_WORD_TOKENS: usize = 256;

impl WordEvents {
    /// The events of a model of `cfg` at `frame_rate` steps per second.
    pub fn new(cfg: &LmConfig, frame_rate: f64) -> Self {
        Self {
            padding_id: cfg.text_padding_token_id.unwrap_or(3),
            frame_rate,
            delay_s: cfg.stt().delay_s(),
            steps: 0,
            word_tokens: Vec::new(),
            unended_word: false,
            last_stop_s: 0.0,
        }
    }

    /// Steps seen so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Adds the next step's text token; returns the events it completes, in order.
    pub fn push(&mut self, token: u32, tokenizer: &TextTokenizer) -> Result<Vec<WordEvent>> {
        let time_s = self.steps as f64 / self.frame_rate - self.delay_s;
        self.steps += 1;
        let mut events = Vec::new();
        if time_s < 0.0 {
            return Ok(events);
        }
        let is_boundary = token == END_OF_PADDING_ID;
        if is_boundary || token == self.padding_id {
            if !self.word_tokens.is_empty() {
                events.push(self.complete_word(tokenizer)?);
            }
        } else {
            self.word_tokens.push(token);
            if self.word_tokens.len() >= MAX_WORD_TOKENS {
                events.push(self.complete_word(tokenizer)?);
            }
        }
        if is_boundary {
            if std::mem::take(&mut self.unended_word) {
                events.push(WordEvent::EndWord { stop_s: time_s });
            }
            self.last_stop_s = time_s;
        }
        Ok(events)
    }

    fn complete_word(&mut self, tokenizer: &TextTokenizer) -> Result<WordEvent> {
        let text = tokenizer.decode(&self.word_tokens)?;
        self.word_tokens.clear();
        self.unended_word = true;
        Ok(WordEvent::Word {
            text,
            start_s: self.last_stop_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stt::tiny_stt::tokenizer;

    /// Events of the tiny-stt config (delay 0.5 s: steps 0..=6 are before it).
    fn events(tokens: &[u32]) -> Vec<WordEvent> {
        let cfg = crate::stt::tiny_stt::config();
        let tok = tokenizer();
        let mut e = WordEvents::new(&cfg, 12.5);
        tokens
            .iter()
            .flat_map(|&t| e.push(t, &tok).unwrap())
            .collect()
    }

    fn at(step: usize) -> f64 {
        step as f64 / 12.5 - 0.5
    }

    fn word(text: &str, start_s: f64) -> WordEvent {
        WordEvent::Word {
            text: text.into(),
            start_s,
        }
    }

    #[test]
    fn words_start_at_their_boundary_and_end_at_the_next() {
        let tok = tokenizer();
        let (a, b) = (tok.encode("hello").unwrap(), tok.encode("world").unwrap());
        let (pad, epad) = (3, END_OF_PADDING_ID);
        // Before the delay: ignored, text included.
        let mut t = vec![epad];
        t.extend(&a);
        t.resize(7, pad);
        // Step 8: a boundary; "hello"; a pause; step 8 + 1 + a + 2: the next boundary, "world"
        // directly followed by a boundary.
        t.push(pad);
        t.push(epad);
        let first = t.len() - 1;
        t.extend(&a);
        t.extend([pad, pad]);
        t.push(epad);
        let second = t.len() - 1;
        t.extend(&b);
        t.push(epad);
        let third = t.len() - 1;
        assert_eq!(
            events(&t),
            vec![
                word("hello", at(first)),
                WordEvent::EndWord { stop_s: at(second) },
                word("world", at(second)),
                WordEvent::EndWord { stop_s: at(third) },
            ]
        );
    }

    #[test]
    fn a_word_without_a_boundary_before_it_starts_at_zero_and_long_words_are_cut() {
        let tok = tokenizer();
        let a = tok.encode("hello").unwrap();
        let mut t = vec![3; 7];
        t.extend(&a);
        t.push(3);
        assert_eq!(events(&t), vec![word("hello", 0.0)]);
        let mut t = vec![3; 7];
        t.extend(std::iter::repeat_n(a[0], MAX_WORD_TOKENS + 1));
        let got = events(&t);
        assert_eq!(got.len(), 1, "one word cut at {MAX_WORD_TOKENS} tokens");
    }
}
