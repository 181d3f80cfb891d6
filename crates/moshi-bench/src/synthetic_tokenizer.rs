//! A stand-in SentencePiece text tokenizer of any vocabulary size, for benchmarking the full
//! pipeline on random weights when no real tokenizer file is at hand. Pieces are `<unk>`, `<s>`,
//! `</s>`, `<pad>` then `▁w4`, `▁w5`, ...; the pipeline's incremental text decoding then costs
//! what it costs with a real vocabulary of that size.

use std::path::Path;

use moshi_loader::tokenizer::TextTokenizer;

use crate::BenchError;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, payload: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

fn varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

/// `ModelProto` bytes of the synthetic unigram vocabulary (`vocab_size >= 5`).
pub fn synthetic_model_bytes(vocab_size: usize) -> Vec<u8> {
    const NORMAL: u64 = 1;
    const UNKNOWN: u64 = 2;
    const CONTROL: u64 = 3;
    let mut proto = Vec::new();
    let mut piece = Vec::new();
    for id in 0..vocab_size.max(5) {
        let (text, kind) = match id {
            0 => ("<unk>".to_string(), UNKNOWN),
            1 => ("<s>".to_string(), CONTROL),
            2 => ("</s>".to_string(), CONTROL),
            3 => ("<pad>".to_string(), CONTROL),
            _ => (format!("\u{2581}w{id}"), NORMAL),
        };
        piece.clear();
        bytes_field(&mut piece, 1, text.as_bytes());
        varint(&mut piece, 2 << 3 | 5);
        piece.extend_from_slice(&(-(id as f32) / 1000.0).to_le_bytes());
        varint_field(&mut piece, 3, kind);
        bytes_field(&mut proto, 1, &piece);
    }
    let mut trainer = Vec::new();
    varint_field(&mut trainer, 3, 1); // unigram
    varint_field(&mut trainer, 4, vocab_size.max(5) as u64);
    for (field, id) in [(40, 0u64), (41, 1), (42, 2), (43, 3)] {
        varint_field(&mut trainer, field, id);
    }
    bytes_field(&mut proto, 2, &trainer);
    proto
}

/// A tokenizer with `vocab_size` pieces (see the module docs).
pub fn synthetic_tokenizer(vocab_size: usize) -> Result<TextTokenizer, BenchError> {
    let origin = format!("<synthetic {vocab_size}-piece tokenizer>");
    TextTokenizer::from_bytes(&synthetic_model_bytes(vocab_size), Path::new(&origin)).map_err(
        |source| BenchError::StandInTokenizer {
            source: Box::new(source),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn has_the_requested_vocabulary_and_decodes_its_pieces() {
        let tok = synthetic_tokenizer(300).unwrap();
        assert_eq!(tok.vocab_size(), 300);
        assert_eq!(tok.id_to_piece(7).as_deref(), Some("\u{2581}w7"));
        assert_eq!(tok.decode(&[7, 8]).unwrap(), "w7 w8");
        let mut dec = tok.incremental_decoder();
        let text: String = [3, 10, 3, 11].iter().map(|&id| dec.push(id)).collect();
        assert_eq!(text.trim_start(), "w10 w11");
    }
}
