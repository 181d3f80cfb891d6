#!/usr/bin/env bash
# Fuzzes one parser of moshi-rs with libFuzzer for a given time.
# Usage: scripts/fuzz.sh TARGET SECONDS     (TARGET: safetensors_header, config_json, wav, npy,
#                                            ogg_opus, client_messages, query, asr_messages,
#                                            tls_pem, ogg_sequence, npy_dtype, gguf)
#        scripts/fuzz.sh --list
#
# Works on stable Rust, without cargo-fuzz or nightly: libfuzzer-sys builds libFuzzer with the
# system C++ compiler, and the coverage instrumentation cargo-fuzz would add comes from stable
# `-C` flags (SanitizerCoverage: inline 8-bit counters, PC table, comparison tracing). No
# AddressSanitizer (Rust is memory-safe; what is searched for is panics, aborts, hangs and
# outsized allocations: libFuzzer's -timeout and -rss_limit_mb catch the last two).
#
# Seeds: fuzz/seeds/TARGET (committed); the growing corpus: fuzz/corpus/TARGET (ignored).
# A crash is written to fuzz/artifacts/TARGET/; once fixed, copy it to fuzz/regressions/TARGET/,
# which `cargo test` replays (crates/moshi-runtime/tests/fuzz_regressions.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(safetensors_header config_json wav npy ogg_opus client_messages query asr_messages tls_pem ogg_sequence npy_dtype gguf)
if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${targets[@]}"
  exit 0
fi
if [[ $# -ne 2 ]] || ! [[ " ${targets[*]} " == *" $1 "* ]] || ! [[ "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS   (targets: ${targets[*]})" >&2
  exit 2
fi
target=$1
seconds=$2
if ! command -v c++ >/dev/null 2>&1; then
  echo "error: a C++ compiler is needed to build libFuzzer (apt-get install g++)" >&2
  exit 1
fi
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
-Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps the instrumentation out of build scripts and proc macros (they
# would not link without libFuzzer), as cargo-fuzz does.
triple=$(rustc -vV | sed -n 's/^host: //p')
cargo build --release --manifest-path fuzz/Cargo.toml --target "$triple" --bin "$target"
mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
exec "fuzz/target/$triple/release/$target" \
  -max_total_time="$seconds" \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -max_len=1048576 \
  -artifact_prefix="fuzz/artifacts/$target/" \
  -print_final_stats=1 \
  "fuzz/corpus/$target" "fuzz/seeds/$target"
