#!/usr/bin/env bash
# One hour of simulated conversation with the tiny model (assets/tiny-a) through the null
# backend on a lockstep clock: resident memory flat after warm-up (within 5 %), the LM's KV
# caches bounded by the attention window, no frame dropped. Prints resident memory per
# simulated minute; the last result is recorded in docs/robustness.md (Soak). A 3-minute version of the same
# test runs with every `cargo test`.
# Usage: scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p moshi-runtime --test soak -- --ignored --nocapture one_hour_conversation_is_flat
