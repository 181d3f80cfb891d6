//! Speech to text (Kyutai's STT models): how a recording is fed and how the text stream becomes
//! timed words, both as `delayed-streams-modeling`'s `stt_from_file_pytorch.py` does.
//!
//! Feeding ([`SttFeeding`]): `ceil(audio_silence_prefix_seconds x frame_rate)` silence frames,
//! the audio zero-padded to whole frames, `ceil(audio_delay_seconds x frame_rate)` silence frames
//! (the text lags the audio by the delay); one LM step per frame.
//!
//! Words ([`WordTimer`], the script's `tokens_to_timestamped_text`): end-of-padding tokens (id
//! 0) are word boundaries; the tokens above PAD between two boundaries decode to a word, its
//! start and end the boundaries' positions over the frame rate minus the offset
//! `int(n_prefix / frame_rate) + delay`, clamped at 0. A segment that decodes to several words gives each as many positions
//! as its own encoding has tokens, the last word the rest. Text before the first boundary is
//! dropped; the last segment ends at EOS, else after at most `frame_rate` positions, else at
//! the end. The timer is incremental: it holds only the tokens since the last boundary.

use moshi_loader::tokenizer::TextTokenizer;
use moshi_loader::LmConfig;

use crate::Result;

/// The end-of-padding id that marks word boundaries (`end_of_padding_id=0` in the script).
pub const END_OF_PADDING_ID: u32 = 0;

/// How a recording is fed to a speech-to-text model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SttFeeding {
    /// Silence frames before the audio.
    pub prefix_frames: usize,
    /// Silence frames after the audio (they flush the text's delay).
    pub suffix_frames: usize,
    /// Seconds subtracted from a position's time to give the time in the input:
    /// `int(prefix_frames / frame_rate) + audio_delay_seconds`.
    pub offset_s: f64,
    /// LM steps per second (Mimi's frame rate, 12.5).
    pub frame_rate: f64,
}

impl SttFeeding {
    /// The feeding of a model of `cfg` (its `stt_config`, the scripts' defaults for what it
    /// leaves out) at `frame_rate` frames per second.
    pub fn of(cfg: &LmConfig, frame_rate: f64) -> Self {
        let stt = cfg.stt();
        let (prefix_s, delay_s) = (stt.silence_prefix_s(), stt.delay_s());
        let prefix_frames = (prefix_s * frame_rate).ceil() as usize;
        Self {
            prefix_frames,
            suffix_frames: (delay_s * frame_rate).ceil() as usize,
            offset_s: (prefix_frames as f64 / frame_rate).trunc() + delay_s,
            frame_rate,
        }
    }

    /// The time in the input of text position `position` (an LM step), clamped at 0.
    pub fn time_of(&self, position: usize) -> f64 {
        (position as f64 / self.frame_rate - self.offset_s).max(0.0)
    }
}

/// One recognised word and its time in the input.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedWord {
    pub text: String,
    pub start_s: f64,
    pub end_s: f64,
}

/// Turns the text stream into timed words as it comes (see the module docs).
#[derive(Clone, Debug)]
pub struct WordTimer {
    feeding: SttFeeding,
    /// Tokens at or below this id are not text (`text_padding_token_id`, default 3).
    padding_id: u32,
    /// Tokens seen.
    position: usize,
    /// Position after the last boundary, once there has been one.
    segment_start: Option<usize>,
    /// The tokens since the last boundary.
    segment: Vec<u32>,
}

impl WordTimer {
    /// A timer for a model of `cfg` fed as `feeding`.
    pub fn new(cfg: &LmConfig, feeding: SttFeeding) -> Self {
        Self {
            feeding,
            padding_id: cfg.text_padding_token_id.unwrap_or(3),
            position: 0,
            segment_start: None,
            segment: Vec::new(),
        }
    }

    /// Adds the next text token; returns the words a boundary completes.
    pub fn push(&mut self, token: u32, tokenizer: &TextTokenizer) -> Result<Vec<TimedWord>> {
        let at = self.position;
        self.position += 1;
        if token != END_OF_PADDING_ID {
            if self.segment_start.is_some() {
                self.segment.push(token);
            }
            return Ok(Vec::new());
        }
        let words = match self.segment_start {
            Some(start) => self.decode_segment(start, &self.segment, tokenizer)?,
            None => Vec::new(),
        };
        self.segment_start = Some(at + 1);
        self.segment.clear();
        Ok(words)
    }

    /// The words of the last segment, at the end of the stream: up to the first EOS, else at
    /// most `int(frame_rate)` tokens, else to the end.
    pub fn finish(&mut self, tokenizer: &TextTokenizer) -> Result<Vec<TimedWord>> {
        let Some(start) = self.segment_start.take() else {
            return Ok(Vec::new());
        };
        let segment = std::mem::take(&mut self.segment);
        let eos = tokenizer
            .eos_id()
            .and_then(|eos| segment.iter().position(|&t| t == eos));
        // The script's `min(len, start + frame_rate)` truncated by `int()`.
        let len = match eos {
            Some(e) => e,
            None => segment.len().min(self.feeding.frame_rate.trunc() as usize),
        };
        self.decode_segment(start, &segment[..len], tokenizer)
    }

    /// The words of `tokens`, the segment starting at position `start`.
    fn decode_segment(
        &self,
        start: usize,
        tokens: &[u32],
        tokenizer: &TextTokenizer,
    ) -> Result<Vec<TimedWord>> {
        let end = start + tokens.len();
        let ids: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| t > self.padding_id)
            .collect();
        let text = tokenizer.decode(&ids)?;
        let words: Vec<&str> = text
            .split(is_python_space)
            .filter(|w| !w.is_empty())
            .collect();
        let f = &self.feeding;
        let word = |text: &str, a: usize, b: usize| TimedWord {
            text: text.to_string(),
            start_s: f.time_of(a),
            end_s: f.time_of(b),
        };
        Ok(match words.len() {
            0 => Vec::new(),
            // One word: the whole decoded text, as decoded (the script does not strip it).
            1 => vec![word(&text, start, end)],
            n => {
                let mut out = Vec::with_capacity(n);
                let mut at = start;
                for w in &words[..n - 1] {
                    let tokens = tokenizer.encode(w)?.len();
                    out.push(word(w, at, at + tokens));
                    at += tokens;
                }
                out.push(word(words[n - 1], at, end));
                out
            }
        })
    }
}

/// Python's `str.isspace` (what `str.split()` splits on): Unicode white space plus the
/// information separators U+001C..U+001F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The tiny-stt fixture's tokenizer and config, for this crate's unit tests.
#[cfg(test)]
pub(crate) mod tiny_stt {
    use moshi_loader::tokenizer::TextTokenizer;
    use moshi_loader::LmConfig;

    pub fn tokenizer() -> TextTokenizer {
        TextTokenizer::from_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tiny-stt/tokenizer.model"
        ))
        .unwrap()
    }

    /// Delay 0.5 s, no silence prefix.
    pub fn config() -> LmConfig {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tiny-stt/config.json"
        ))
        .unwrap();
        LmConfig::from_json_str(&text, std::path::Path::new("config.json")).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::tiny_stt::tokenizer;
    use super::*;

    /// A timer for the tiny-stt config (delay 0.5 s, no prefix: offset 0.5 s).
    fn timer() -> WordTimer {
        let cfg = super::tiny_stt::config();
        WordTimer::new(&cfg, SttFeeding::of(&cfg, 12.5))
    }

    fn words(tokens: &[u32]) -> Vec<(String, f64, f64)> {
        let (tok, mut t) = (tokenizer(), timer());
        let mut out = Vec::new();
        for &x in tokens {
            out.extend(t.push(x, &tok).unwrap());
        }
        out.extend(t.finish(&tok).unwrap());
        out.into_iter()
            .map(|w| (w.text, w.start_s, w.end_s))
            .collect()
    }

    /// Time of position `p` as the script computes it (offset 0.5 s).
    fn at(p: usize) -> f64 {
        (p as f64 / 12.5 - 0.5).max(0.0)
    }

    #[test]
    fn segments_follow_the_scripts_rules() {
        let tok = tokenizer();
        let (a, b) = (tok.encode("hello").unwrap(), tok.encode("world").unwrap());
        let (pad, epad, eos) = (3, END_OF_PADDING_ID, tok.eos_id().unwrap());
        // Text before the first boundary is dropped; no boundary at all: no words.
        assert!(words(&a).is_empty());
        // Two words in one segment: the first gets as many steps as its own tokens.
        let mut t = vec![pad; 8];
        t.push(epad); // position 8: the segment starts at 9
        t.extend(&a);
        t.push(pad);
        t.extend(&b);
        let end = t.len();
        t.push(epad);
        let got = words(&t);
        let split = 9 + a.len();
        assert_eq!(
            got,
            vec![
                ("hello".to_string(), at(9), at(split)),
                ("world".to_string(), at(split), at(end)),
            ]
        );
        // The last segment ends at EOS ...
        let mut t = vec![pad; 10];
        t.push(epad);
        t.extend(&a);
        let eos_at = t.len();
        t.push(eos);
        t.extend(&b);
        assert_eq!(words(&t), vec![("hello".to_string(), at(11), at(eos_at))]);
        // ... else after at most int(12.5) = 12 steps: tokens after those are not read.
        let mut t = vec![pad; 10];
        t.push(epad);
        t.extend(&a);
        t.resize(11 + 12, pad);
        t.extend(&b);
        assert_eq!(words(&t), vec![("hello".to_string(), at(11), at(23))]);
        // ... else at the end of the stream.
        let mut t = vec![epad];
        t.extend(&a);
        assert_eq!(
            words(&t),
            vec![("hello".to_string(), at(1), at(1 + a.len()))]
        );
    }

    #[test]
    fn python_splits_on_the_separators_too() {
        assert!(is_python_space('\u{1f}') && is_python_space('\u{a0}'));
        assert!(!is_python_space('\u{12}'));
    }
}
