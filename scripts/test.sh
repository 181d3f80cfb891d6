#!/usr/bin/env bash
# The project's test command: installs what is needed (PulseAudio for the virtual-device tests;
# Chromium, puppeteer-core and Kyutai's Python client for the `serve` client tests), runs every
# test of the workspace, builds the API documentation (rustdoc warnings as errors), checks that
# the candle peer benchmark still compiles, then runs the
# emulated aarch64 suite (Debian's rustc with the arm64 standard library, qemu; setup.sh --aarch64)
# and the aarch64-apple-darwin type check of moshi-kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --audio-e2e --serve-e2e --aarch64
cargo test --workspace 2>&1
# The API documentation builds without a broken or private link (rustdoc's warnings as errors).
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps 2>&1
# The candle peer benchmark lives outside the workspace (candle is no dependency of moshi-rs);
# it must keep compiling against the APIs of moshi-kernels and moshi-bench (probe, shapes).
cargo check --locked --manifest-path scripts/peer-candle/Cargo.toml 2>&1
# The NEON kernels, built for aarch64 and run under qemu (scripts/test-aarch64.sh).
bash scripts/test-aarch64.sh
# moshi-kernels type-checked for Apple silicon (scripts/check-darwin.sh: no SDK, so no linking).
bash scripts/check-darwin.sh
