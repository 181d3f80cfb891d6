#!/usr/bin/env bash
# Installs the system packages moshi-rs needs on Debian/Ubuntu (idempotent).
# Usage: bash scripts/setup.sh [--audio-e2e]   (--audio-e2e adds PulseAudio for the virtual-device test)
set -euo pipefail
pkgs=(pkg-config libasound2-dev libopus-dev)
if [[ "${1:-}" == "--audio-e2e" ]]; then
  pkgs+=(pulseaudio pulseaudio-utils libasound2-plugins alsa-utils sox python3-numpy)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install the Rust toolchain (https://rustup.rs) first" >&2
  exit 1
fi
