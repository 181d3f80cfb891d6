//! Fuzz target: `moshi_fuzz::npy` on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_fuzz::npy(data));
