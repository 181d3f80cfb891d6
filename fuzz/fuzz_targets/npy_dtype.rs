//! Fuzz target: `moshi_fuzz::npy_dtype` (fuzz/src/lib.rs): npy headers with arbitrary dtype strings.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_fuzz::npy_dtype(data));
