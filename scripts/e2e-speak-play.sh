#!/usr/bin/env bash
# e2e-speak-play.sh: end-to-end test of `moshi-rs speak --play` on the virtual speaker
# (scripts/virtual-audio.sh). Speaks the tiny TTS fixture's script (greedy) while writing the WAV
# too, records the virtual speaker and checks that it played that audio: normalised
# cross-correlation >= MIN_NCC and every loud 250 ms window found at one lag (no sample inserted
# or lost on the way). A run whose playback has a gap must have reported it ("ran dry"): exit 3;
# a gap speak did not report fails.
# Exit 0: clean; 3: a gap, reported; other: failure.
# Usage: bash scripts/e2e-speak-play.sh   (env: MOSHI_RS = binary, default target/debug/moshi-rs;
#        E2E_OUT = folder for the recordings, default a temp folder; MIN_NCC default 0.95)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MOSHI_RS=${MOSHI_RS:-$ROOT/target/debug/moshi-rs}
MIN_NCC=${MIN_NCC:-0.95}
OUT=${E2E_OUT:-$(mktemp -d /tmp/moshi-rs-e2e-play.XXXXXX)}
mkdir -p "$OUT"
export VA_DIR=${VA_DIR:-$OUT/va}
export VA_RATE=24000
VA="bash $ROOT/scripts/virtual-audio.sh"
MODEL=$ROOT/assets/tiny-tts
VOICE=expresso/ex03-ex01_happy_001_channel1_334s.wav
TEXT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["script"])' "$MODEL/ref/tts_greedy.json")

[ -x "$MOSHI_RS" ] || { echo "e2e: $MOSHI_RS not built (cargo build -p moshi-cli)" >&2; exit 2; }
cleanup() { $VA stop >/dev/null 2>&1 || true; }
trap cleanup EXIT

$VA start
eval "$($VA env)"
$VA record-start "$OUT/speaker.wav" 24000 va_speaker.monitor speaker
sleep 0.3
"$MOSHI_RS" speak "$TEXT" "$OUT/out.wav" --model "$MODEL" --voice "$VOICE" --greedy --play \
    >"$OUT/speak.stdout" 2>"$OUT/speak.stderr" \
    || { echo "e2e: moshi-rs speak --play failed:" >&2; cat "$OUT/speak.stderr" >&2; exit 1; }
sleep 0.4   # the last samples still travel through the device buffers
$VA record-stop speaker
grep -v '^ALSA lib' "$OUT/speak.stderr" >&2 || true

ok=1; cmp=$($VA compare "$OUT/out.wav" "$OUT/speaker.wav" "$MIN_NCC") || ok=0
echo "speaker vs the WAV speak wrote: $cmp"
windows=$(sed -n 's/.*windows_ok=\([0-9]*\/[0-9]*\).*/\1/p' <<<"$cmp")
jumps=$(sed -n 's/.*lag_jumps=\([0-9]*\).*/\1/p' <<<"$cmp")
[ -n "$windows" ] && [ "${windows%/*}" = "${windows#*/}" ] && [ "${windows#*/}" -gt 0 ] || ok=0
[ "${jumps:-1}" = 0 ] || ok=0
if grep -q "ran dry" "$OUT/speak.stderr"; then
    echo "e2e speak --play: a gap, reported by speak"
    exit 3
fi
grep -q "without a gap" "$OUT/speak.stderr" || { echo "e2e: speak did not report its playback" >&2; exit 1; }
[ "$ok" = 1 ] || { echo "e2e: the speaker did not play the speech (and speak reported no gap)" >&2; exit 1; }
echo "e2e speak --play: OK"
