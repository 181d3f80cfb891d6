#!/usr/bin/env bash
# The project's main job in one command: installs what is needed, builds moshi-rs (release) and lets
# Moshi answer a WAV file. Uses the real Kyutai model (MLX q4) when it is in the Hugging Face cache or
# MOSHI_MODEL names a model folder/repo; otherwise the bundled tiny model with RANDOM weights
# (assets/tiny-a), which exercises the whole pipeline offline but speaks noise.
# Usage: bash scripts/run.sh [in.wav] [out.wav]
set -euo pipefail
cd "$(dirname "$0")/.."
in_wav="${1:-assets/tiny-a/input.wav}"
out_wav="${2:-out.wav}"
bash scripts/setup.sh
cargo build --release -p moshi-cli
hf_hub="${HF_HOME:-$HOME/.cache/huggingface}/hub"
model="${MOSHI_MODEL:-}"
if [[ -z "$model" ]]; then
  if compgen -G "$hf_hub/models--kyutai--moshiko-mlx-q4/snapshots/*/model.q4.safetensors" >/dev/null; then
    model="kyutai/moshiko-mlx-q4"
  else
    model="assets/tiny-a"
    echo "note: no Moshi weights found; using the bundled tiny model with RANDOM weights (pipeline test, speaks noise)" >&2
  fi
fi
exec ./target/release/moshi-rs file "$in_wav" "$out_wav" --model "$model" --transcript "${out_wav%.wav}.transcript.tsv" --tokens-out "${out_wav%.wav}.tokens.jsonl"
