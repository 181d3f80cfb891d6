//! Words with their time in Moshi's output: text pieces arrive per 80 ms frame; a piece that
//! starts with a space (or the first piece) starts a new word.

pub use moshi_loader::escape::escape_controls;
use moshi_runtime::FRAME_MS;

/// One word and the output frames it spans.
#[derive(Debug, Clone, PartialEq)]
pub struct Word {
    pub text: String,
    pub first_frame: u64,
    pub last_frame: u64,
}

/// Words in order.
#[derive(Debug, Default, Clone)]
pub struct Transcript {
    pub words: Vec<Word>,
}

impl Transcript {
    /// Adds the text generated at output frame `frame`.
    pub fn push(&mut self, frame: u64, piece: &str) {
        for (i, part) in piece.split(' ').enumerate() {
            let starts_word = i > 0 || self.words.is_empty();
            if part.is_empty() {
                continue;
            }
            match self.words.last_mut() {
                Some(w) if !starts_word && !w.text.is_empty() => {
                    w.text.push_str(part);
                    w.last_frame = frame;
                }
                _ => self.words.push(Word {
                    text: part.to_string(),
                    first_frame: frame,
                    last_frame: frame,
                }),
            }
        }
        // A trailing space ends the current word: the next piece starts a new one.
        if piece.ends_with(' ') {
            if let Some(w) = self.words.last() {
                if !w.text.is_empty() {
                    self.words.push(Word {
                        text: String::new(),
                        first_frame: frame,
                        last_frame: frame,
                    });
                }
            }
        }
    }

    /// The whole text.
    #[allow(dead_code)] // used by tests; the CLI prints pieces live
    pub fn text(&self) -> String {
        self.words
            .iter()
            .filter(|w| !w.text.is_empty())
            .map(|w| w.text.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// `start_s<TAB>end_s<TAB>word` per line; times are in the output audio.
    pub fn to_tsv(&self) -> String {
        tsv_of(&self.words)
    }

    /// [`Self::to_tsv`] of the words that are complete (all but the last, which the next
    /// piece may continue), removed: a transcript written as it comes keeps one word in memory.
    pub fn take_complete_tsv(&mut self) -> String {
        let complete = self.words.len().saturating_sub(1);
        let tsv = tsv_of(&self.words[..complete]);
        self.words.drain(..complete);
        tsv
    }
}

/// `start_s<TAB>end_s<TAB>word` per non-empty word.
fn tsv_of(words: &[Word]) -> String {
    let mut s = String::new();
    for w in words.iter().filter(|w| !w.text.is_empty()) {
        let start = w.first_frame as f64 * FRAME_MS / 1e3;
        let end = (w.last_frame + 1) as f64 * FRAME_MS / 1e3;
        s += &tsv_line(start, end, &w.text);
    }
    s
}

/// One `start_s<TAB>end_s<TAB>word` line (times to 10 ms); control characters (a tab would break
/// the columns) are written escaped ([`escape_controls`]).
pub fn tsv_line(start_s: f64, end_s: f64, word: &str) -> String {
    format!("{start_s:.2}\t{end_s:.2}\t{}\n", escape_controls(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_become_timed_words() {
        let mut t = Transcript::default();
        t.push(0, "Hel");
        t.push(1, "lo");
        t.push(3, " wor");
        t.push(4, "ld");
        t.push(6, " again ");
        t.push(7, "x");
        assert_eq!(t.text(), "Hello world again x");
        assert_eq!(
            t.to_tsv(),
            "0.00\t0.16\tHello\n0.24\t0.40\tworld\n0.48\t0.56\tagain\n0.56\t0.64\tx\n"
        );
        // Written as they come: the same lines.
        let mut t = Transcript::default();
        let mut streamed = String::new();
        for (frame, piece) in [
            (0, "Hel"),
            (1, "lo"),
            (3, " wor"),
            (4, "ld"),
            (6, " again "),
            (7, "x"),
        ] {
            t.push(frame, piece);
            streamed += &t.take_complete_tsv();
            assert!(t.words.len() <= 1);
        }
        streamed += &t.to_tsv();
        assert_eq!(
            streamed,
            "0.00\t0.16\tHello\n0.24\t0.40\tworld\n0.48\t0.56\tagain\n0.56\t0.64\tx\n"
        );
        let mut t = Transcript::default();
        t.push(2, "a\tb");
        assert_eq!(t.to_tsv(), "0.16\t0.24\ta\\tb\n");
    }
}
