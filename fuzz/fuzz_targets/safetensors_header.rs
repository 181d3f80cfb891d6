//! Fuzz target: `moshi_fuzz::safetensors_header` on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_fuzz::safetensors_header(data));
