#!/usr/bin/env bash
# Installs what moshi-rs needs on Debian/Ubuntu (idempotent).
# Usage: bash scripts/setup.sh [--audio-e2e] [--serve-e2e] [--aarch64]
#   --audio-e2e  PulseAudio and tools for the virtual-device tests (chat, Kyutai's Python client)
#   --serve-e2e  what the `moshi-rs serve` client tests need: HAProxy and curl (serve_haproxy,
#                serve_container), Chromium, Node and puppeteer-core
#                (scripts/serve-clients/node_modules), PortAudio and a Python venv with Kyutai's
#                client, moshi==0.2.13 from PyPI (target/serve-clients/venv); and a second venv,
#                target/stt-clients/venv, for the speech-to-text clients: Kyutai's DSM scripts'
#                packages and livekit-plugins-kyutai-lasuite (scripts/stt-clients/requirements.txt)
#   --aarch64    what the emulated aarch64 suite (scripts/test-aarch64.sh) needs: Debian's rustc
#                (rustc-web) with its arm64 standard library (the arm64 architecture is added to
#                dpkg for it), the aarch64 cross linker and libc, qemu's user-mode emulator, and
#                Debian's Rust source (rust-web-src) from which scripts/check-darwin.sh builds the
#                standard library for its aarch64-apple-darwin check.
#                Debian's packages, not rustup's: CI reaches Debian's archive but need not reach
#                rustup's download server. Debian's cargo is not installed (rustup's cargo drives
#                Debian's rustc through RUSTC), so nothing shadows rustup's toolchain on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
audio=0
serve=0
aarch64=0
for arg in "$@"; do
  case "$arg" in
    --audio-e2e) audio=1 ;;
    --serve-e2e) serve=1 ;;
    --aarch64) aarch64=1 ;;
    *) echo "setup.sh: unknown option $arg (expected --audio-e2e, --serve-e2e, --aarch64)" >&2; exit 2 ;;
  esac
done
pkgs=(pkg-config libasound2-dev libopus-dev)
if ((audio)); then
  pkgs+=(pulseaudio pulseaudio-utils libasound2-plugins alsa-utils sox python3-numpy)
fi
if ((serve)); then
  pkgs+=(chromium libportaudio2 python3-venv haproxy curl)
  command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)
fi
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
updated=0
if ((aarch64)); then
  pkgs+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user rustc-web libstd-rust-web-dev:arm64
    rust-web-src)
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
    updated=1
  fi
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  ((updated)) || $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install the Rust toolchain (https://rustup.rs) first" >&2
  exit 1
fi
if ((serve)); then
  # Kyutai's Python client (unmodified moshi.client); --no-deps keeps torch out.
  venv="$ROOT/target/serve-clients/venv"
  if ! "$venv/bin/python" -c 'import sphn, sounddevice, aiohttp, numpy, importlib.metadata as m; assert m.version("moshi") == "0.2.13"' >/dev/null 2>&1; then
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
      "sphn>=0.2,<0.3" "numpy>=1.26,<2.3" "aiohttp>=3.10.5,<3.12" "sounddevice==0.5"
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "moshi==0.2.13"
  fi
  # The speech-to-text clients (scripts/stt-clients/): every version pinned in requirements.txt;
  # the venv is made again when an import fails or that file changed since it was made.
  venv="$ROOT/target/stt-clients/venv"
  reqs="$ROOT/scripts/stt-clients/requirements.txt"
  if ! cmp -s "$reqs" "$venv/requirements.txt" ||
    ! "$venv/bin/python" -c 'import msgpack, numpy, sphn, websockets, sounddevice, lasuite.plugins.kyutai' >/dev/null 2>&1; then
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs"
    cp "$reqs" "$venv/requirements.txt"
  fi
  if [ ! -d "$ROOT/scripts/serve-clients/node_modules/puppeteer-core" ]; then
    (cd "$ROOT/scripts/serve-clients" && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
