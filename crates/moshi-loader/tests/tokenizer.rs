//! The text tokenizer against sentencepiece 0.2.3 (`ref/tokenizer_cases.json`): encode, decode,
//! id_to_piece, byte fallback, and incremental decoding of a token stream.

mod common;

use common::asset;
use moshi_loader::tokenizer::TextTokenizer;
use serde_json::Value;

fn cases() -> Value {
    serde_json::from_str(&std::fs::read_to_string(asset("ref/tokenizer_cases.json")).unwrap())
        .unwrap()
}

fn tokenizer() -> TextTokenizer {
    TextTokenizer::from_file(asset("tokenizer.model")).unwrap()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn strings_of(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn model_proto_fields_are_read() {
    let tok = tokenizer();
    let m = tok.model();
    assert_eq!(
        m.pieces.len(),
        cases()["vocab_size"].as_u64().unwrap() as usize
    );
    assert!(m.trainer.byte_fallback);
    assert_eq!(
        m.trainer.model_type,
        moshi_loader::sentencepiece_proto::ModelType::Unigram
    );
    assert_eq!(
        (
            m.trainer.unk_id,
            m.trainer.bos_id,
            m.trainer.eos_id,
            m.trainer.pad_id
        ),
        (0, 1, 2, 3)
    );
    assert_eq!(m.normalizer.name, "nmt_nfkc");
    assert!(m.normalizer.add_dummy_prefix && m.normalizer.remove_extra_whitespaces);
    assert!(!m.normalizer.precompiled_charsmap.is_empty());
}

#[test]
fn encode_matches_sentencepiece() {
    let tok = tokenizer();
    for case in cases()["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = tok.encode(text).unwrap();
        assert_eq!(ids, ids_of(&case["ids"]), "encode {text:?}");
        let pieces: Vec<String> = ids.iter().map(|&i| tok.id_to_piece(i).unwrap()).collect();
        assert_eq!(pieces, strings_of(&case["pieces"]), "pieces of {text:?}");
    }
}

#[test]
fn decode_matches_sentencepiece() {
    let tok = tokenizer();
    let all = cases();
    for case in all["decode"].as_array().unwrap() {
        let ids = ids_of(&case["ids"]);
        assert_eq!(
            tok.decode(&ids).unwrap(),
            case["text"].as_str().unwrap(),
            "decode {ids:?}"
        );
        let pieces: Vec<String> = ids.iter().map(|&i| tok.id_to_piece(i).unwrap()).collect();
        assert_eq!(pieces, strings_of(&case["pieces"]));
    }
    // Encoded texts decode back to their normalized form.
    for case in all["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let decoded = tok.decode(&ids_of(&case["ids"])).unwrap();
        let normalized = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(decoded, normalized, "round trip of {text:?}");
    }
}

#[test]
fn id_to_piece_matches_sentencepiece() {
    let tok = tokenizer();
    for (id, piece) in cases()["id_to_piece"].as_object().unwrap() {
        assert_eq!(
            tok.id_to_piece(id.parse().unwrap()).as_deref(),
            piece.as_str(),
            "id {id}"
        );
    }
    assert_eq!(tok.id_to_piece(384), None);
    assert!(tok
        .decode(&[5, 384])
        .unwrap_err()
        .to_string()
        .contains("id 384 is outside the vocabulary of 384"));
}

/// Feeds `ids` one by one; returns the concatenated increments.
fn incremental(tok: &TextTokenizer, ids: &[u32]) -> String {
    let mut dec = tok.incremental_decoder();
    let mut out: String = ids.iter().map(|&id| dec.push(id)).collect();
    out.push_str(&dec.finish());
    out
}

fn skip_filtered(ids: &[u32]) -> Vec<u32> {
    ids.iter()
        .copied()
        .filter(|&i| i != 0 && i != 3 && i < 384)
        .collect()
}

#[test]
fn incremental_decoding_concatenates_to_the_full_decode() {
    let tok = tokenizer();
    let all = cases();
    let mut streams: Vec<Vec<u32>> = Vec::new();
    for section in ["encode", "decode"] {
        streams.extend(
            all[section]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| ids_of(&c["ids"])),
        );
    }
    // Model-like streams: PAD/EPAD runs, the text start token 384, bytes split anywhere.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..300 {
        let len = 1 + (state >> 60) as usize;
        let mut ids = Vec::new();
        for _ in 0..len * 4 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (state >> 33) as u32;
            ids.push(match r % 10 {
                0 => 3,
                1 => 0,
                2 => 384,
                3..=5 => 4 + (r >> 8) % 256, // byte pieces
                _ => (r >> 8) % 384,
            });
        }
        streams.push(ids);
    }
    for ids in streams {
        let want = tok.decode(&skip_filtered(&ids)).unwrap();
        assert_eq!(incremental(&tok, &ids), want, "ids {ids:?}");
    }
}

#[test]
fn incremental_decoder_waits_for_complete_characters() {
    let tok = tokenizer();
    let mut dec = tok.incremental_decoder();
    // "▁", then 😀 as four byte pieces <0xF0><0x9F><0x98><0x80>, then "s".
    assert_eq!(dec.push(260), "");
    assert_eq!(dec.push(3), "");
    assert_eq!(dec.push(244), "");
    assert_eq!(dec.push(163), "");
    assert_eq!(dec.push(156), "");
    assert_eq!(dec.push(132), "😀");
    assert_eq!(dec.push(261), "s");
    // A character cut short by a normal piece becomes one U+FFFD per byte, like sentencepiece.
    assert_eq!(dec.push(244), "");
    assert_eq!(dec.push(163), "");
    assert_eq!(dec.push(261), "\u{FFFD}\u{FFFD}s");
}

#[test]
fn hf_tokenizer_pipeline_round_trips_valid_text() {
    let tok = tokenizer();
    let hf = tok.hf_tokenizer().unwrap();
    for case in cases()["encode"].as_array().unwrap() {
        let ids = ids_of(&case["ids"]);
        assert_eq!(hf.decode(&ids, false).unwrap(), tok.decode(&ids).unwrap());
    }
}
