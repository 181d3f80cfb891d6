//! Replays the fuzz targets' seeds and every kept regression input (crashes `scripts/fuzz.sh`
//! found, fixed since) through the targets' own code (`fuzz/src/lib.rs`): each must return, an
//! error being a fine answer to bad input, never panic. Runs with every `cargo test`.

#[path = "../../../fuzz/src/lib.rs"]
mod targets;

use moshi_test_support::replay_fuzz_inputs as replay;

#[test]
fn safetensors_header_inputs() {
    replay("safetensors_header", targets::safetensors_header);
}

#[test]
fn gguf_inputs() {
    replay("gguf", targets::gguf);
}

#[test]
fn config_json_inputs() {
    replay("config_json", targets::config_json);
}

#[test]
fn wav_inputs() {
    replay("wav", targets::wav);
}

#[test]
fn npy_inputs() {
    replay("npy", targets::npy);
}

#[test]
fn npy_dtype_inputs() {
    replay("npy_dtype", targets::npy_dtype);
}
