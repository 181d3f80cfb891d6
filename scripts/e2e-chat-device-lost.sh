#!/usr/bin/env bash
# e2e-chat-device-lost.sh: `moshi-rs chat` on virtual devices (scripts/virtual-audio.sh) whose
# sound server is killed mid-conversation. Checks that chat notices the lost device and stops
# within a bounded time, on its own (MODE=duration: --duration-s ends while the device is gone)
# or on Ctrl-C (MODE=ctrl-c: no duration; one SIGINT 3 s after the loss, once chat has seen it). A chat still running
# LIMIT_S seconds after the loss fails the check (it is then killed).
# Exit 0: stopped in time with the loss reported; other: failure.
# Usage: MODE=duration|ctrl-c bash scripts/e2e-chat-device-lost.sh
#        (env: MOSHI_RS = binary, default target/debug/moshi-rs; E2E_OUT = folder for the logs;
#        LIMIT_S default 15)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${MODE:-duration}
LIMIT_S=${LIMIT_S:-15}
MOSHI_RS=${MOSHI_RS:-$ROOT/target/debug/moshi-rs}
OUT=${E2E_OUT:-$(mktemp -d /tmp/moshi-rs-e2e-lost.XXXXXX)}
mkdir -p "$OUT"
export VA_DIR=${VA_DIR:-$OUT/va}
VA="bash $ROOT/scripts/virtual-audio.sh"

[ -x "$MOSHI_RS" ] || { echo "e2e: $MOSHI_RS not built (cargo build -p moshi-cli)" >&2; exit 2; }
CHAT=
cleanup() {
    if [ -n "$CHAT" ] && kill -0 "$CHAT" 2>/dev/null; then kill -KILL "$CHAT" 2>/dev/null || true; fi
    $VA stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

$VA start
eval "$($VA env)"
duration=()
[ "$MODE" = duration ] && duration=(--duration-s 4)
"$MOSHI_RS" chat --model "$ROOT/assets/tiny-a" --greedy "${duration[@]}" \
    >"$OUT/chat.stdout" 2>"$OUT/chat.stderr" &
CHAT=$!
for _ in $(seq 1 200); do grep -q listening "$OUT/chat.stderr" 2>/dev/null && break; sleep 0.05; done
grep -q listening "$OUT/chat.stderr" || { echo "e2e: chat did not start:" >&2; cat "$OUT/chat.stderr" >&2; exit 1; }
sleep 1
$VA stop
lost_at=$SECONDS
if [ "$MODE" = ctrl-c ]; then
    sleep 3
    kill -INT "$CHAT"
fi
while kill -0 "$CHAT" 2>/dev/null && [ $((SECONDS - lost_at)) -lt "$LIMIT_S" ]; do sleep 0.1; done
if kill -0 "$CHAT" 2>/dev/null; then
    echo "e2e: chat still running ${LIMIT_S} s after its sound server was killed ($MODE)" >&2
    grep -v '^ALSA lib' "$OUT/chat.stderr" | tail -20 >&2
    exit 1
fi
status=0; wait "$CHAT" || status=$?
CHAT=
grep -v '^ALSA lib' "$OUT/chat.stderr" | grep -v '^\[RTF' >&2 || true
grep -q 'audio device lost' "$OUT/chat.stderr" || { echo "e2e: the device loss was not reported" >&2; exit 1; }
grep -q '^stopped: ' "$OUT/chat.stderr" || { echo "e2e: chat exited (status $status) without its summary" >&2; exit 1; }
echo "e2e chat device lost ($MODE): stopped $((SECONDS - lost_at)) s after the loss, exit status $status"
