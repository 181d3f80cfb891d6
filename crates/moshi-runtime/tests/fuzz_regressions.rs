//! Replays the fuzz targets' seeds and every kept regression input (crashes `scripts/fuzz.sh`
//! found, fixed since) through the targets' own code (`fuzz/src/lib.rs`): each must return, an
//! error being a fine answer to bad input, never panic. Runs with every `cargo test`.

use std::path::PathBuf;

#[path = "../../../fuzz/src/lib.rs"]
mod targets;

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = moshi_test_support::repo_root()
        .join("fuzz")
        .join(kind)
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".gitkeep"));
    files.sort();
    files
}

fn replay(target: &str, run: fn(&[u8])) {
    let seeds = inputs("seeds", target);
    assert!(!seeds.is_empty(), "no seeds for {target}");
    for path in seeds.iter().chain(&inputs("regressions", target)) {
        let bytes = std::fs::read(path).unwrap();
        eprintln!("{target}: {}", path.display());
        run(&bytes);
    }
}

#[test]
fn safetensors_header_inputs() {
    replay("safetensors_header", targets::safetensors_header);
}

#[test]
fn config_json_inputs() {
    replay("config_json", targets::config_json);
}

#[test]
fn wav_inputs() {
    replay("wav", targets::wav);
}

#[test]
fn npy_inputs() {
    replay("npy", targets::npy);
}
