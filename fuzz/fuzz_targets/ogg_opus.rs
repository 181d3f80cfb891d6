//! Fuzz target: `server::ogg_opus` (fuzz/src/server.rs) on arbitrary bytes.
#![no_main]

// Each target uses one of the module's functions.
#[allow(dead_code)]
#[path = "../src/server.rs"]
mod server;

libfuzzer_sys::fuzz_target!(|data: &[u8]| server::ogg_opus(data));
