//! What each fuzz target does with its input: the parsers moshi-rs runs on files a user hands it.
//! Each returns normally for any input (an `Err` is a correct answer to bad input); a panic, an
//! abort, a hang or an allocation out of proportion to the input is a bug. The same functions
//! replay the kept regression inputs in `cargo test` (moshi-runtime's `fuzz_regressions` test).

use std::path::Path;

use moshi_loader::{LmConfig, MimiConfig, SafetensorsFile};
use moshi_runtime::wav::MonoReader;

/// Most mono samples read from one fuzzed WAV (its header may claim billions).
const MAX_WAV_SAMPLES: usize = 1 << 20;

/// A safetensors file: header length, JSON header, dtypes, shapes and data offsets.
pub fn safetensors_header(data: &[u8]) {
    let _ = SafetensorsFile::validate_bytes(data, Path::new("fuzz.safetensors"));
}

/// A GGUF file (candle's `model.q8.gguf`): header, metadata, tensor infos, alignment, offsets.
pub fn gguf(data: &[u8]) {
    let _ = moshi_loader::gguf_file::GgufFile::validate_bytes(data, Path::new("fuzz.gguf"));
}

/// A `config.json` (LM) and a `mimi_config.json` (Mimi): parsing and validation.
pub fn config_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let origin = Path::new("fuzz.json");
    if let Ok(cfg) = LmConfig::from_json_str(text, origin) {
        // What the model derives from a validated config must not overflow.
        let _ = (cfg.parameter_count(), cfg.hidden_dim(), cfg.max_delay());
        // A speech-to-text config's feeding (frames from `stt_config`'s seconds).
        let _ = moshi_model::stt::SttFeeding::of(&cfg, 12.5);
    }
    if let Ok(cfg) = MimiConfig::from_json_str(text, origin) {
        let _ = (cfg.frame_size_samples(), cfg.seanet.hop_samples());
    }
}

/// A WAV file read as mono f32, chunk by chunk.
pub fn wav(data: &[u8]) {
    let Ok(mut reader) =
        MonoReader::from_reader(std::io::Cursor::new(data.to_vec()), Path::new("fuzz.wav"))
    else {
        return;
    };
    let _ = reader.len_samples();
    let mut out = Vec::new();
    while out.len() < MAX_WAV_SAMPLES {
        match reader.read_chunk(4096, &mut out) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

/// A `.npy` file read as integers and as floats.
pub fn npy(data: &[u8]) {
    let origin = Path::new("fuzz.npy");
    let _ = moshi_loader::npy::parse_i64(data, origin);
    let _ = moshi_loader::npy::parse_f32(data, origin);
}

/// A `.npy` file whose header is valid but for its dtype string: the input's text up to its
/// first newline is the `descr`, the rest picks the length of a 1-D array whose data follows in
/// full. Read as integers and as floats, it is accepted exactly when the dtype is one the reader
/// supports, and no error message carries a raw control character.
pub fn npy_dtype(data: &[u8]) {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let Ok(descr) = std::str::from_utf8(&data[..split]) else {
        return;
    };
    if descr.contains('\'') {
        return; // ends the literal: no longer a dtype-only change of the header
    }
    let len = data.len().saturating_sub(split) % 5;
    let elem_bytes = moshi_loader::npy::DTYPES
        .iter()
        .find(|(d, _)| *d == descr)
        .map(|(_, b)| *b);
    let text = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({len},), }}");
    let padded = (10 + text.len() + 1).div_ceil(64) * 64 - 10;
    if padded > usize::from(u16::MAX) {
        return;
    }
    let mut file = b"\x93NUMPY\x01\x00".to_vec();
    file.extend_from_slice(&(padded as u16).to_le_bytes());
    file.extend_from_slice(text.as_bytes());
    file.resize(10 + padded - 1, b' ');
    file.push(b'\n');
    file.resize(file.len() + len * elem_bytes.unwrap_or(8), 0);
    let origin = Path::new("fuzz.npy");
    let as_i64 = moshi_loader::npy::parse_i64(&file, origin).map(drop);
    let as_f32 = moshi_loader::npy::parse_f32(&file, origin).map(drop);
    for e in [&as_i64, &as_f32]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
    {
        let message = e.to_string();
        assert!(
            !message.chars().any(char::is_control),
            "raw control character in {message:?}"
        );
    }
    assert_eq!(
        as_i64.is_ok() || as_f32.is_ok(),
        elem_bytes.is_some(),
        "dtype {descr:?}: {as_i64:?} / {as_f32:?}"
    );
}
