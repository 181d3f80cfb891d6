#!/usr/bin/env bash
# The project's test command: installs what is needed, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --audio-e2e
cargo test --workspace 2>&1
