#!/usr/bin/env bash
# Type-checks moshi-kernels, where every SIMD path lives, for aarch64-apple-darwin (no macOS SDK
# here, so nothing is linked and no test runs; the NEON code itself runs under qemu in
# test-aarch64.sh): Debian's rustc (rustc-web) with the standard library built from Debian's Rust
# source (rust-web-src, /usr/lib/rustlib/src/rust) by cargo's -Zbuild-std (RUSTC_BOOTSTRAP=1; the
# standard library's own dependencies come from crates.io). Both from
# `bash scripts/setup.sh --aarch64`. About 6 minutes of CPU cold (mostly the standard library),
# seconds warm.
#
# moshi-loader, moshi-model and moshi-runtime are not checked: moshi-loader's hf-hub pulls in
# rustls and so ring, whose build script compiles C for the target, and there is no C compiler
# for aarch64-apple-darwin here (`cc: error: unrecognized command-line option '-arch'`,
# `'-mmacosx-version-min=11.0'`: the host gcc); moshi-runtime's cpal also needs the SDK's
# CoreAudio headers (coreaudio-sys runs bindgen against them).
# Usage: bash scripts/check-darwin.sh     (called by test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-apple-darwin
if [[ ! -x /usr/bin/rustc ]]; then
  echo "error: /usr/bin/rustc (Debian's rustc-web) not found; run bash scripts/setup.sh --aarch64" \
    "first" >&2
  exit 1
fi
if [[ ! -d /usr/lib/rustlib/src/rust/library/std ]]; then
  echo "error: Debian's Rust source (/usr/lib/rustlib/src/rust/library) is missing;" \
    "run bash scripts/setup.sh --aarch64 first" >&2
  exit 1
fi
export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
# Its own target folder: Debian's rustc, and a standard library of its own.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/darwin-check}
echo "== $target: cargo check -p moshi-kernels (build-std)"
start=$SECONDS
cargo check --locked -Zbuild-std=core,alloc,std --target "$target" -p moshi-kernels 2>&1
echo "== $target: checked in $((SECONDS - start)) s"
