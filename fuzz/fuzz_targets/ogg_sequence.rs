//! Fuzz target: `server::ogg_sequence` (fuzz/src/server.rs): Ogg pages of a valid stream, repeated, missing or out of order.
#![no_main]

// Each target uses one of the module's functions.
#[allow(dead_code)]
#[path = "../src/server.rs"]
mod server;

libfuzzer_sys::fuzz_target!(|data: &[u8]| server::ogg_sequence(data));
