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
