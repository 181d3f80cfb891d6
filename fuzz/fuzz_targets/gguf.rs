//! Fuzz target: `moshi_fuzz::gguf` on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_fuzz::gguf(data));
