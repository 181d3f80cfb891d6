//! Fuzz target: `moshi_fuzz::wav` on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_fuzz::wav(data));
