#!/usr/bin/env bash
# The emulated aarch64 suite: builds moshi-kernels and moshi-model for aarch64-unknown-linux-gnu
# (Debian's rustc with its arm64 standard library, from `bash scripts/setup.sh --aarch64`) and runs
# their tests under qemu's user-mode emulator (doc tests run in the x86-64 suite):
#   1. on qemu's `max` CPU (NEON and the dot product): moshi-kernels' unit and integration tests:
#      the portable, `neon` and `neondot` kernels each against the scalar reference on the x86
#      grids, matrix-vector == matrix-matrix bit for bit, non-finite rows, the fixed-point
#      arrangement digit for digit, the dense and Mimi products, the big/little core count;
#   2. on a Cortex-A53 (no dot product): `neondot` unavailable, `neon` detected, the same tests;
#   3. the end-to-end greedy runs on `max` (detected kernel `neondot`): tiny-a's LM tokens and
#      logits against Kyutai's LMGen (f32 and bf16 weights), MLX q4/q8 f32-math tokens, Mimi's
#      streaming codes; the q4 and q8 runs again on the Cortex-A53 (`neon` detected).
# Usage: bash scripts/test-aarch64.sh     (called by test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
for tool in /usr/bin/rustc aarch64-linux-gnu-gcc qemu-aarch64; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: $tool not found; run bash scripts/setup.sh --aarch64 first" >&2
    exit 1
  fi
done
if [[ ! -d /usr/lib/rustlib/$target ]]; then
  echo "error: Debian's arm64 Rust standard library is missing (/usr/lib/rustlib/$target);" \
    "run bash scripts/setup.sh --aarch64 first" >&2
  exit 1
fi
export RUSTC=/usr/bin/rustc
# Its own target folder: Debian's rustc is another compiler than rustup's.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/aarch64-emu}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# The cross libc the linker used, also at run time: without LD_LIBRARY_PATH the cross loader
# finds the arm64 multiarch libc (libc6:arm64, another build of glibc, installed with the arm64
# Rust std) first, and the two together hang in the first pthread_create.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib"
# The test harness's threads, and so the thread team, fit the 2 emulated cores of CI.
export RUST_TEST_THREADS=2
emulated() {
  local cpu=$1
  shift
  echo "== aarch64 (qemu -cpu $cpu): cargo test $*"
  local start=$SECONDS
  QEMU_CPU=$cpu cargo test --locked --target "$target" "$@" 2>&1
  echo "== aarch64 (qemu -cpu $cpu): $((SECONDS - start)) s"
}
echo "== aarch64: building the tests"
start=$SECONDS
model_tests=(-p moshi-model --test lm_reference --test mimi_reference)
cargo test --locked --target "$target" -p moshi-kernels --lib --tests --no-run 2>&1
cargo test --locked --target "$target" "${model_tests[@]}" --no-run 2>&1
echo "== aarch64: built in $((SECONDS - start)) s"
emulated max -p moshi-kernels --lib --tests
emulated cortex-a53 -p moshi-kernels --lib --tests
emulated max -p moshi-model --test lm_reference -- greedy_ f32_math
emulated max -p moshi-model --test mimi_reference -- streaming_encode_matches_reference_exactly
emulated cortex-a53 -p moshi-model --test lm_reference -- f32_math
