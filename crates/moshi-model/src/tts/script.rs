//! A script to the machine's entries (`moshi/models/tts.py` `script_to_entries`): each turn's
//! text cleaned (’ to ', ':' to a space, parentheses dropped), split on whitespace and on SSML
//! `<break time="Xs"/>` tags; every word tokenized on its own, the first word of a turn
//! prefixed with its speaker's token when the speaker changes (multi-speaker models), each
//! word's forced padding `padding_between + tokens - 1`; a break is a pause entry of
//! `round(X x frame rate)` steps.

use super::machine::{Entry, MAIN_SPEAKER, OTHER_SPEAKER};
use crate::Result;

/// Frames per second of the text stream (Mimi's 12.5 Hz).
const FRAME_RATE_HZ: f64 = 12.5;

/// How a script becomes entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScriptOptions {
    /// The model has speaker conditioning: turns start with a speaker token.
    pub multi_speaker: bool,
    /// Padding forced between words (Kyutai's scripts use 1).
    pub padding_between: usize,
    /// moshi-server's text preprocessing (`tts_preprocess.rs`) instead of `script_to_entries`:
    /// '–' removed too, and a break of X s (`<break time="X s"/>`, the `/` required) pauses
    /// `max(int(min(X, 10) x 12.5), 1)` steps (none for 0).
    pub moshi_server: bool,
}

/// What turns a word into tokens (the model's SentencePiece `encode`, no BOS/EOS).
pub type WordEncoder<'a> = dyn Fn(&str) -> Result<Vec<u32>> + Send + Sync + 'a;

/// Turns words into entries, keeping track of the speaker across calls (so a script can be fed
/// piecewise, as text streams in).
pub struct ScriptReader<'a> {
    encode: &'a WordEncoder<'a>,
    options: ScriptOptions,
    last_speaker: Option<usize>,
}

impl<'a> ScriptReader<'a> {
    pub fn new(encode: &'a WordEncoder<'a>, options: ScriptOptions) -> Self {
        Self {
            encode,
            options,
            last_speaker: None,
        }
    }

    /// The entries of a whole script (turn `i` spoken by speaker `i % 2`, main first).
    pub fn script(&mut self, turns: &[&str]) -> Result<Vec<Entry>> {
        let mut entries = Vec::new();
        for (i, turn) in turns.iter().enumerate() {
            entries.extend(self.turn_part(i % 2, turn, true)?);
        }
        Ok(entries)
    }

    /// The entries of a piece of `speaker`'s turn (`starts_turn`: its first piece, whose first
    /// word carries the speaker token on a change of speaker).
    pub fn turn_part(
        &mut self,
        speaker: usize,
        text: &str,
        starts_turn: bool,
    ) -> Result<Vec<Entry>> {
        let text = clean(text, self.options.moshi_server);
        let mut first_content = starts_turn;
        let mut entries = Vec::new();
        for piece in split(&text, self.options.moshi_server) {
            match piece {
                Piece::Word(word) => {
                    let mut tokens = (self.encode)(word)?;
                    if first_content {
                        if self.options.multi_speaker && self.last_speaker != Some(speaker) {
                            self.last_speaker = Some(speaker);
                            tokens.insert(0, [MAIN_SPEAKER, OTHER_SPEAKER][speaker % 2]);
                        }
                        first_content = false;
                    }
                    let padding = match self.options.padding_between {
                        0 => 0,
                        p => (p + tokens.len()).saturating_sub(1),
                    };
                    entries.push(Entry {
                        tokens,
                        text: word.to_string(),
                        padding,
                    });
                }
                Piece::Break { seconds } if self.options.moshi_server => {
                    if seconds > 0.0 {
                        entries.push(Entry {
                            tokens: Vec::new(),
                            text: format!("<break time=\"{seconds:.2}s\">"),
                            padding: ((seconds.min(10.0) * FRAME_RATE_HZ) as usize).max(1),
                        });
                    }
                }
                Piece::Break { seconds } => entries.push(Entry {
                    tokens: Vec::new(),
                    text: String::new(),
                    padding: (seconds * FRAME_RATE_HZ).round_ties_even() as usize,
                }),
            }
        }
        Ok(entries)
    }
}

/// `script_to_entries`'s replacements (and moshi-server's, which also drops '–').
fn clean(text: &str, moshi_server: bool) -> String {
    let text = text
        .replace('’', "'")
        .replace(':', " ")
        .replace(['(', ')'], "");
    match moshi_server {
        true => text.replace('–', ""),
        false => text,
    }
}

enum Piece<'t> {
    Word(&'t str),
    Break { seconds: f64 },
}

/// Words and breaks in order (`re.search` of `<break time="..s"/>` or whitespace, the break
/// tried first at each position).
fn split(text: &str, moshi_server: bool) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut word_start = 0;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let tag = match moshi_server {
            true => server_break_tag(rest),
            false => break_tag(rest),
        };
        let (len, seconds) = match tag {
            Some((len, seconds)) => (len, Some(seconds)),
            None => {
                let ws: usize = rest
                    .chars()
                    .take_while(|c| c.is_whitespace())
                    .map(char::len_utf8)
                    .sum();
                (ws, None)
            }
        };
        if len == 0 {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        }
        if word_start < i {
            pieces.push(Piece::Word(&text[word_start..i]));
        }
        if let Some(seconds) = seconds {
            pieces.push(Piece::Break { seconds });
        }
        i += len;
        word_start = i;
    }
    if word_start < text.len() {
        pieces.push(Piece::Word(&text[word_start..]));
    }
    pieces
}

/// `<break\s+time="(D+(.D*)?)s"\s*/?>` at the start of `s`: its length and seconds.
fn break_tag(s: &str) -> Option<(usize, f64)> {
    let rest = break_time_value(s)?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    // The optional `.D*` (any one character, then digits), tried first, as the regex does.
    let with_fraction = rest[digits..].chars().next().and_then(|c| {
        let after = digits + c.len_utf8();
        let more = rest[after..].bytes().take_while(u8::is_ascii_digit).count();
        let number_len = after + more;
        rest[number_len..].starts_with("s\"").then_some(number_len)
    });
    let number_len =
        with_fraction.or_else(|| rest[digits..].starts_with("s\"").then_some(digits))?;
    let seconds: f64 = rest[..number_len].parse().ok()?;
    let tail = &rest[number_len + 2..];
    let ws = leading_whitespace(tail);
    let tail = &tail[ws..];
    let close = if tail.starts_with("/>") {
        2
    } else if tail.starts_with('>') {
        1
    } else {
        return None;
    };
    let consumed = s.len() - tail.len() + close;
    Some((consumed, seconds))
}

/// moshi-server's `<break\s+time="([0-9.]+)s"\s*/>` at the start of `s`: its length and
/// seconds (None for a number that does not parse, as there).
fn server_break_tag(s: &str) -> Option<(usize, f64)> {
    let rest = break_time_value(s)?;
    let number_len = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    if number_len == 0 {
        return None;
    }
    let tail = rest[number_len..].strip_prefix("s\"")?;
    let ws = leading_whitespace(tail);
    let tail = tail[ws..].strip_prefix("/>")?;
    let seconds: f64 = rest[..number_len].parse().ok()?;
    Some((s.len() - tail.len(), seconds))
}

/// What follows `<break\s+time="` at the start of `s` (both conventions' tags begin so).
fn break_time_value(s: &str) -> Option<&str> {
    let rest = s.strip_prefix("<break")?;
    let ws = leading_whitespace(rest);
    if ws == 0 {
        return None;
    }
    rest[ws..].strip_prefix("time=\"")
}

fn leading_whitespace(s: &str) -> usize {
    s.chars()
        .take_while(|c| c.is_whitespace())
        .map(char::len_utf8)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letters(word: &str) -> Result<Vec<u32>> {
        Ok(word.bytes().map(u32::from).collect())
    }

    #[test]
    fn words_breaks_speakers_and_padding_follow_script_to_entries() {
        let encode: &WordEncoder = &letters;
        let mut reader = ScriptReader::new(
            encode,
            ScriptOptions {
                multi_speaker: true,
                padding_between: 1,
                moshi_server: false,
            },
        );
        let entries = reader
            .script(&["Hi (there): you’re <break time=\"0.5s\"/> ok", "", "Bye"])
            .unwrap();
        let texts: Vec<&str> = entries.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, ["Hi", "there", "you're", "", "ok", "Bye"]);
        assert_eq!(entries[0].tokens, [MAIN_SPEAKER, b'H' as u32, b'i' as u32]);
        assert_eq!(entries[0].padding, 3);
        assert_eq!(entries[1].padding, 5);
        // 0.5 s x 12.5 = 6.25 -> 6 steps of pause.
        assert_eq!((entries[3].tokens.len(), entries[3].padding), (0, 6));
        // The empty second turn switches nothing; the third is the main speaker's again, who
        // spoke last: no token.
        assert_eq!(entries[5].tokens, letters("Bye").unwrap());
        let turns = reader_entries(&["a", "b"]);
        assert_eq!(turns[1].tokens[0], OTHER_SPEAKER);
    }

    fn reader_entries(turns: &[&str]) -> Vec<Entry> {
        let encode: &WordEncoder = &letters;
        ScriptReader::new(
            encode,
            ScriptOptions {
                multi_speaker: true,
                padding_between: 0,
                moshi_server: false,
            },
        )
        .script(turns)
        .unwrap()
    }

    #[test]
    fn moshi_server_preprocessing_caps_breaks_and_drops_dashes() {
        let encode: &WordEncoder = &letters;
        let mut reader = ScriptReader::new(
            encode,
            ScriptOptions {
                multi_speaker: true,
                padding_between: 1,
                moshi_server: true,
            },
        );
        let entries = reader
            .turn_part(
                0,
                "a–b <break time=\"0.5s\"/> c <break time=\"30s\"/><break time=\"0s\"/>",
                true,
            )
            .unwrap();
        let texts: Vec<&str> = entries.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "ab",
                "<break time=\"0.50s\">",
                "c",
                "<break time=\"30.00s\">"
            ]
        );
        // int(0.5 x 12.5) = 6; 30 s capped at 10 s: 125.
        assert_eq!((entries[1].padding, entries[3].padding), (6, 125));
        assert!(entries[1].tokens.is_empty());
        assert_eq!(entries[0].tokens[0], MAIN_SPEAKER);
        // Later pieces of the same turn get no speaker token.
        let more = reader.turn_part(0, "d", false).unwrap();
        assert_eq!(more[0].tokens, letters("d").unwrap());
    }

    #[test]
    fn break_tags_match_the_regex() {
        assert_eq!(break_tag("<break time=\"3s\"/>x").map(|b| b.0), Some(18));
        assert_eq!(
            break_tag("<break  time=\"1.25s\" >").map(|b| b.1),
            Some(1.25)
        );
        assert!(break_tag("<break time=\"s\"/>").is_none());
        assert!(break_tag("<breaktime=\"3s\"/>").is_none());
        assert!(break_tag("<break time=\"3\"/>").is_none());
    }
}
