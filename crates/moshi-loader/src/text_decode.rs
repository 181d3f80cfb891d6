//! SentencePiece-exact decoding of text ids (batch and incremental): `▁` becomes a space, the
//! dummy-prefix space of the first piece is dropped, byte pieces are re-assembled into UTF-8 with
//! one U+FFFD per invalid byte, control pieces vanish and `<unk>` shows as the unk surface.

use std::sync::Arc;

use crate::sentencepiece_proto::{PieceType, SentencePieceModel};

const SPACE_SYMBOL: char = '\u{2581}';

/// What decoding needs to know about one id.
#[derive(Clone, Debug)]
enum DecodePiece {
    /// Normal or user-defined piece, `▁` already replaced by spaces; `leading_space` when it began with `▁`.
    Text {
        text: String,
        leading_space: bool,
    },
    Byte(u8),
    Control,
    Unknown,
}

/// The id -> decoding table of a SentencePiece model.
#[derive(Debug)]
pub struct PieceTable {
    pieces: Vec<DecodePiece>,
    unk_surface: String,
    /// SentencePiece drops the leading `▁` of the first piece when either flag is set.
    strip_first_space: bool,
}

impl PieceTable {
    pub fn new(model: &SentencePieceModel) -> Self {
        let pieces = model
            .pieces
            .iter()
            .map(|p| match p.kind {
                PieceType::Control => DecodePiece::Control,
                PieceType::Unknown => DecodePiece::Unknown,
                PieceType::Byte => match SentencePieceModel::byte_of(p) {
                    Some(b) => DecodePiece::Byte(b),
                    None => DecodePiece::Text {
                        text: p.piece.replace(SPACE_SYMBOL, " "),
                        leading_space: false,
                    },
                },
                _ => DecodePiece::Text {
                    text: p.piece.replace(SPACE_SYMBOL, " "),
                    leading_space: p.piece.starts_with(SPACE_SYMBOL),
                },
            })
            .collect();
        let n = &model.normalizer;
        Self {
            pieces,
            unk_surface: model.trainer.unk_surface.clone(),
            strip_first_space: n.add_dummy_prefix || n.remove_extra_whitespaces,
        }
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Surface of a non-byte piece given whether any text precedes it.
    fn surface(&self, id: usize, text_so_far_empty: bool) -> &str {
        match &self.pieces[id] {
            DecodePiece::Text {
                text,
                leading_space,
            } if *leading_space && text_so_far_empty && self.strip_first_space => &text[1..],
            DecodePiece::Text { text, .. } => text,
            DecodePiece::Unknown => &self.unk_surface,
            DecodePiece::Control | DecodePiece::Byte(_) => "",
        }
    }

    /// Decodes ids (all `< len()`, checked by the caller) exactly like `SentencePieceProcessor::Decode`.
    pub fn decode(&self, ids: &[usize]) -> String {
        let mut out = String::new();
        let mut bytes = Vec::new();
        for &id in ids {
            if let DecodePiece::Byte(b) = self.pieces[id] {
                bytes.push(b);
                continue;
            }
            push_byte_run(&mut out, &bytes);
            bytes.clear();
            let empty = out.is_empty();
            out.push_str(self.surface(id, empty));
        }
        push_byte_run(&mut out, &bytes);
        out
    }
}

/// Appends a complete run of byte pieces: valid UTF-8 characters as themselves, every byte that
/// does not start a valid character as one U+FFFD (SentencePiece consumes one byte per error).
fn push_byte_run(out: &mut String, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                return;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&bytes[..valid]).expect("valid prefix"));
                out.push('\u{FFFD}');
                bytes = &bytes[valid + 1..];
            }
        }
    }
}

/// Turns a stream of text ids into text, piece by piece, as the model emits them.
///
/// Ids `0` (EPAD / `<unk>`), `3` (PAD) and any id outside the vocabulary (such as the text start
/// token `text_card`) are skipped, as Kyutai's servers do. Byte pieces are held back until they
/// complete a UTF-8 character. The concatenation of everything returned by [`push`](Self::push)
/// and [`finish`](Self::finish) equals `decode` of the non-skipped ids.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    table: Arc<PieceTable>,
    skip_ids: Vec<u32>,
    pending_bytes: Vec<u8>,
    text_so_far_empty: bool,
}

impl IncrementalDecoder {
    /// Ids 0 (EPAD) and 3 (PAD) are skipped; see [`with_skip_ids`](Self::with_skip_ids).
    pub fn new(table: Arc<PieceTable>) -> Self {
        Self::with_skip_ids(table, &[0, 3])
    }

    pub fn with_skip_ids(table: Arc<PieceTable>, skip_ids: &[u32]) -> Self {
        Self {
            table,
            skip_ids: skip_ids.to_vec(),
            pending_bytes: Vec::new(),
            text_so_far_empty: true,
        }
    }

    /// Whether `id` is dropped without producing text.
    pub fn skips(&self, id: u32) -> bool {
        self.skip_ids.contains(&id) || id as usize >= self.table.len()
    }

    /// Feeds one id; returns the text it completes (often empty).
    pub fn push(&mut self, id: u32) -> String {
        if self.skips(id) {
            return String::new();
        }
        let mut out = String::new();
        if let DecodePiece::Byte(b) = self.table.pieces[id as usize] {
            self.pending_bytes.push(b);
            self.emit_complete_bytes(&mut out);
        } else {
            self.flush_bytes(&mut out);
            let empty = self.text_so_far_empty && out.is_empty();
            out.push_str(self.table.surface(id as usize, empty));
        }
        self.text_so_far_empty &= out.is_empty();
        out
    }

    /// Ends the stream: bytes still waiting for the rest of their character become U+FFFD.
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        self.flush_bytes(&mut out);
        self.text_so_far_empty &= out.is_empty();
        out
    }

    /// Forgets everything (a new conversation).
    pub fn reset(&mut self) {
        self.pending_bytes.clear();
        self.text_so_far_empty = true;
    }

    fn flush_bytes(&mut self, out: &mut String) {
        push_byte_run(out, &self.pending_bytes);
        self.pending_bytes.clear();
    }

    /// Emits the pending bytes up to an incomplete character at the end, which stays pending.
    fn emit_complete_bytes(&mut self, out: &mut String) {
        let keep_from = match std::str::from_utf8(&self.pending_bytes) {
            Ok(_) => self.pending_bytes.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // An invalid byte: everything before the incomplete tail (if any) is final.
            Err(_) => incomplete_tail_start(&self.pending_bytes),
        };
        push_byte_run(out, &self.pending_bytes[..keep_from]);
        self.pending_bytes.drain(..keep_from);
    }
}

/// Start of the longest suffix that is an incomplete (but so far valid) UTF-8 character.
fn incomplete_tail_start(bytes: &[u8]) -> usize {
    for start in (bytes.len().saturating_sub(3)..bytes.len()).rev() {
        if let Err(e) = std::str::from_utf8(&bytes[start..]) {
            if e.valid_up_to() == 0 && e.error_len().is_none() {
                return start;
            }
        }
    }
    bytes.len()
}
