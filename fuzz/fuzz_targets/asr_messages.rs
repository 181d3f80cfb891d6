//! Fuzz target: `server::asr_messages` (fuzz/src/server.rs) on arbitrary bytes.
#![no_main]

// Each target uses one of the module's functions.
#[allow(dead_code)]
#[path = "../src/server.rs"]
mod server;

libfuzzer_sys::fuzz_target!(|data: &[u8]| server::asr_messages(data));
