//! A small hand-written protobuf wire decoder for SentencePiece `.model` files (`ModelProto`):
//! pieces with scores and types, the trainer spec and the normalizer spec.

use std::path::Path;

use crate::{LoaderError, Result};

/// `SentencePiece.Type` of one vocabulary entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PieceType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl PieceType {
    fn from_wire(v: u64) -> Option<Self> {
        Some(match v {
            1 => PieceType::Normal,
            2 => PieceType::Unknown,
            3 => PieceType::Control,
            4 => PieceType::UserDefined,
            5 => PieceType::Unused,
            6 => PieceType::Byte,
            _ => return None,
        })
    }
}

/// `TrainerSpec.ModelType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    Unigram,
    Bpe,
    Word,
    Char,
}

/// One vocabulary entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub piece: String,
    pub score: f32,
    pub kind: PieceType,
}

/// The `TrainerSpec` fields that matter for encoding and decoding.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainerSpec {
    pub model_type: ModelType,
    pub vocab_size: Option<u32>,
    pub byte_fallback: bool,
    pub unk_id: i64,
    pub bos_id: i64,
    pub eos_id: i64,
    pub pad_id: i64,
    pub unk_surface: String,
}

impl Default for TrainerSpec {
    fn default() -> Self {
        // Defaults of sentencepiece_model.proto.
        Self {
            model_type: ModelType::Unigram,
            vocab_size: None,
            byte_fallback: false,
            unk_id: 0,
            bos_id: 1,
            eos_id: 2,
            pad_id: -1,
            unk_surface: " \u{2047} ".into(),
        }
    }
}

/// The `NormalizerSpec` fields.
#[derive(Clone, Debug, PartialEq)]
pub struct NormalizerSpec {
    pub name: String,
    pub precompiled_charsmap: Vec<u8>,
    pub add_dummy_prefix: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
}

impl Default for NormalizerSpec {
    fn default() -> Self {
        Self {
            name: String::new(),
            precompiled_charsmap: Vec::new(),
            add_dummy_prefix: true,
            remove_extra_whitespaces: true,
            escape_whitespaces: true,
        }
    }
}

/// A parsed `ModelProto`.
#[derive(Clone, Debug, PartialEq)]
pub struct SentencePieceModel {
    pub pieces: Vec<Piece>,
    pub trainer: TrainerSpec,
    pub normalizer: NormalizerSpec,
}

/// One decoded field value.
enum Value<'a> {
    Varint(u64),
    Fixed32(u32),
    Fixed64,
    Bytes(&'a [u8]),
}

/// Iterates over the `(field number, value)` pairs of one message.
struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Byte offset of `buf` inside the file, for error messages.
    base: usize,
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8], base: usize) -> Self {
        Self { buf, pos: 0, base }
    }

    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.buf.get(self.pos).ok_or_else(|| {
                format!("varint runs past the end at byte {}", self.base + self.pos)
            })?;
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(format!(
            "varint longer than 10 bytes at byte {}",
            self.base + self.pos
        ))
    }

    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                "field of {n} bytes at byte {} runs past the end of its message ({} bytes left)",
                self.base + self.pos,
                self.buf.len() - self.pos
            )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next field, its value and the file offset of the value.
    fn next_field(&mut self) -> Option<std::result::Result<(u32, Value<'a>, usize), String>> {
        if self.pos >= self.buf.len() {
            return None;
        }
        Some((|| {
            let at = self.base + self.pos;
            let key = self.varint()?;
            let (field, wire) = ((key >> 3) as u32, key & 7);
            if field == 0 {
                return Err(format!("field number 0 at byte {at}"));
            }
            let offset = self.base + self.pos;
            let value = match wire {
                0 => Value::Varint(self.varint()?),
                1 => {
                    self.take(8)?;
                    Value::Fixed64
                }
                2 => {
                    let n = self.varint()? as usize;
                    Value::Bytes(self.take(n)?)
                }
                5 => Value::Fixed32(u32::from_le_bytes(
                    self.take(4)?.try_into().expect("4 bytes"),
                )),
                other => {
                    return Err(format!(
                        "field {field} at byte {at} has wire type {other}, expected 0, 1, 2 or 5"
                    ))
                }
            };
            Ok((field, value, offset))
        })())
    }
}

fn utf8(bytes: &[u8], what: &str, at: usize) -> std::result::Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} at byte {at} is not UTF-8"))
}

fn expect_varint(v: &Value<'_>, what: &str, at: usize) -> std::result::Result<u64, String> {
    match v {
        Value::Varint(x) => Ok(*x),
        _ => Err(format!("{what} at byte {at} is not a varint")),
    }
}

fn parse_piece(buf: &[u8], base: usize) -> std::result::Result<Piece, String> {
    let mut piece = Piece {
        piece: String::new(),
        score: 0.0,
        kind: PieceType::Normal,
    };
    let mut has_text = false;
    let mut fields = Fields::new(buf, base);
    while let Some(f) = fields.next_field() {
        match f? {
            (1, Value::Bytes(b), at) => {
                piece.piece = utf8(b, "piece text", at)?;
                has_text = true;
            }
            (2, Value::Fixed32(bits), _) => piece.score = f32::from_bits(bits),
            (3, v, at) => {
                let t = expect_varint(&v, "piece type", at)?;
                piece.kind = PieceType::from_wire(t)
                    .ok_or_else(|| format!("piece type {t} at byte {at}, expected 1..=6"))?;
            }
            (n @ 1..=3, _, at) => {
                return Err(format!(
                    "piece field {n} at byte {at} has the wrong wire type"
                ))
            }
            _ => {}
        }
    }
    if !has_text {
        return Err(format!("vocabulary entry at byte {base} has no piece text"));
    }
    Ok(piece)
}

fn parse_trainer(buf: &[u8], base: usize) -> std::result::Result<TrainerSpec, String> {
    let mut t = TrainerSpec::default();
    let mut fields = Fields::new(buf, base);
    while let Some(f) = fields.next_field() {
        let (field, value, at) = f?;
        match field {
            3 => {
                t.model_type = match expect_varint(&value, "model_type", at)? {
                    1 => ModelType::Unigram,
                    2 => ModelType::Bpe,
                    3 => ModelType::Word,
                    4 => ModelType::Char,
                    other => {
                        return Err(format!("model_type {other} at byte {at}, expected 1..=4"))
                    }
                }
            }
            4 => t.vocab_size = Some(expect_varint(&value, "vocab_size", at)? as u32),
            35 => t.byte_fallback = expect_varint(&value, "byte_fallback", at)? != 0,
            // int32 fields are sign-extended to 64 bits on the wire.
            40 => t.unk_id = expect_varint(&value, "unk_id", at)? as i32 as i64,
            41 => t.bos_id = expect_varint(&value, "bos_id", at)? as i32 as i64,
            42 => t.eos_id = expect_varint(&value, "eos_id", at)? as i32 as i64,
            43 => t.pad_id = expect_varint(&value, "pad_id", at)? as i32 as i64,
            44 => match value {
                Value::Bytes(b) => t.unk_surface = utf8(b, "unk_surface", at)?,
                _ => return Err(format!("unk_surface at byte {at} is not a string")),
            },
            _ => {}
        }
    }
    Ok(t)
}

fn parse_normalizer(buf: &[u8], base: usize) -> std::result::Result<NormalizerSpec, String> {
    let mut n = NormalizerSpec::default();
    let mut fields = Fields::new(buf, base);
    while let Some(f) = fields.next_field() {
        match f? {
            (1, Value::Bytes(b), at) => n.name = utf8(b, "normalizer name", at)?,
            (2, Value::Bytes(b), _) => n.precompiled_charsmap = b.to_vec(),
            (3, v, at) => n.add_dummy_prefix = expect_varint(&v, "add_dummy_prefix", at)? != 0,
            (4, v, at) => {
                n.remove_extra_whitespaces = expect_varint(&v, "remove_extra_whitespaces", at)? != 0
            }
            (5, v, at) => n.escape_whitespaces = expect_varint(&v, "escape_whitespaces", at)? != 0,
            (k @ 1..=2, _, at) => {
                return Err(format!("normalizer field {k} at byte {at} is not a string"))
            }
            _ => {}
        }
    }
    Ok(n)
}

impl SentencePieceModel {
    /// Parses the bytes of a `.model` file; `path` names the file in errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let bad = |reason: String| LoaderError::BadTokenizer {
            path: path.to_path_buf(),
            reason: format!("not a SentencePiece model (protobuf ModelProto): {reason}"),
        };
        let mut pieces = Vec::new();
        let mut trainer = TrainerSpec::default();
        let mut normalizer = NormalizerSpec::default();
        let mut fields = Fields::new(bytes, 0);
        while let Some(f) = fields.next_field() {
            match f.map_err(bad)? {
                (1, Value::Bytes(b), at) => pieces.push(parse_piece(b, at).map_err(bad)?),
                (2, Value::Bytes(b), at) => trainer = parse_trainer(b, at).map_err(bad)?,
                (3, Value::Bytes(b), at) => normalizer = parse_normalizer(b, at).map_err(bad)?,
                (4 | 5, Value::Bytes(_), _) => {} // self-test data, denormalizer
                (field, _, at) => {
                    return Err(bad(format!(
                        "top-level field {field} at byte {at}, expected only fields 1..=5 holding messages"
                    )))
                }
            }
        }
        if pieces.is_empty() {
            return Err(bad(format!(
                "{} bytes without a single vocabulary piece",
                bytes.len()
            )));
        }
        let unk = usize::try_from(trainer.unk_id)
            .ok()
            .filter(|&u| u < pieces.len())
            .ok_or_else(|| {
                bad(format!(
                    "unk_id {} is outside the vocabulary of {} pieces",
                    trainer.unk_id,
                    pieces.len()
                ))
            })?;
        if pieces[unk].kind != PieceType::Unknown {
            return Err(bad(format!(
                "unk_id {unk} names piece `{}` of type {:?}, expected type UNKNOWN",
                pieces[unk].piece, pieces[unk].kind
            )));
        }
        Ok(Self {
            pieces,
            trainer,
            normalizer,
        })
    }

    /// The byte value of a BYTE piece `<0xNN>`.
    pub fn byte_of(piece: &Piece) -> Option<u8> {
        if piece.kind != PieceType::Byte {
            return None;
        }
        let hex = piece.piece.strip_prefix("<0x")?.strip_suffix('>')?;
        (hex.len() == 2)
            .then(|| u8::from_str_radix(hex, 16).ok())
            .flatten()
    }
}
