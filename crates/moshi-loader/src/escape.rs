//! Text from files, configs, tokenizers and clients shown on a terminal: its control characters
//! written escaped, so that a tensor name, a config value, a tokenizer piece or a client's
//! message can neither send a terminal escape sequence (ESC, CSI), nor rewrite the line (CR,
//! backspace), nor reorder what is shown (bidirectional overrides). Every place that prints such
//! text goes through [`escape_controls`] or [`escape_controls_in_lines`].

use std::borrow::Cow;

/// Whether `c` must not reach a terminal as it is: a control character (C0, DEL, C1: ESC, CR,
/// backspace, the 8-bit CSI U+009B ...) or a bidirectional formatting character (U+061C,
/// U+200E/U+200F, U+202A to U+202E, U+2066 to U+2069), which reorders the text around it.
pub fn is_unsafe_for_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// Appends `c` escaped as Rust writes it: `\t`, `\n`, `\r`, `\0`, `\u{1b}`, `\u{202e}`.
fn push_escaped(out: &mut String, c: char) {
    if c.is_control() {
        out.extend(c.escape_debug());
    } else {
        out.extend(c.escape_unicode());
    }
}

/// `text` with every character [`is_unsafe_for_terminal`] escaped (`\u{1b}`, `\t`, `\n` ...);
/// borrowed unchanged when there is none. Its output has none, so escaping twice changes
/// nothing.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    escape_except(text, None)
}

/// [`escape_controls`] that keeps line breaks (`\n`): for a message of several lines.
pub fn escape_controls_in_lines(text: &str) -> Cow<'_, str> {
    escape_except(text, Some('\n'))
}

fn escape_except(text: &str, kept: Option<char>) -> Cow<'_, str> {
    let escaped = |c: char| is_unsafe_for_terminal(c) && Some(c) != kept;
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_bidi_characters_are_escaped_and_the_rest_kept() {
        assert!(matches!(escape_controls("plain é ▁word"), Cow::Borrowed(_)));
        assert_eq!(escape_controls("a\u{1b}[31mred"), "a\\u{1b}[31mred");
        assert_eq!(escape_controls("<i8\0"), "<i8\\0");
        assert_eq!(escape_controls("x\ty\r\n"), "x\\ty\\r\\n");
        assert_eq!(escape_controls("\u{9b}2J\u{7f}"), "\\u{9b}2J\\u{7f}");
        assert_eq!(escape_controls("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(
            escape_controls_in_lines("one\ntwo\u{1b}"),
            "one\ntwo\\u{1b}"
        );
        let once = escape_controls("\u{1b}\u{8}\u{202e}");
        assert_eq!(escape_controls(&once), once);
    }
}
