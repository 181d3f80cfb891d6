//! Fuzz target: `moshi_fuzz::config_json` on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_fuzz::config_json(data));
