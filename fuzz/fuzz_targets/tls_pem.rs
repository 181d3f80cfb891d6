//! Fuzz target: `server::tls_pem` (fuzz/src/server.rs): the PEM certificate chain and key of `--tls-cert` / `--tls-key`.
#![no_main]

// Each target uses one of the module's functions.
#[allow(dead_code)]
#[path = "../src/server.rs"]
mod server;

libfuzzer_sys::fuzz_target!(|data: &[u8]| server::tls_pem(data));
