#!/usr/bin/env bash
# python-client-e2e.sh: Kyutai's own Python client (moshi.client of moshi==0.2.13, unmodified)
# talks with `moshi-rs serve --model assets/tiny-a` on virtual PulseAudio devices
# (scripts/virtual-audio.sh): assets/tiny-a/input.wav is played into the client's microphone,
# the client's speaker is recorded. Checks, against the server's --record:
#   - the server decoded the speech it was given: every loud 0.48 s window of what the model
#     processed found in what the microphone delivered (its feed, recorded) at ncc >= 0.9, but
#     for one window per input frame the server dropped (it says how many in its counters);
#     against the feed rather than the WAV, so that a hiccup of the player feeding the virtual
#     microphone on a loaded machine is no failure of the client or the server;
#   - the client's speaker played what the server sent: every 0.5 s window of the audio sent
#     found in the speaker recording at one constant lag (+-2 samples), ncc >= MIN_NCC, once the
#     silences the client inserted itself are cut out. Kyutai's client has no jitter buffer: when
#     a frame has not arrived by the time its speaker callback runs, it plays one block (1920
#     samples) of silence and prints [LAG]; every such block inside the conversation must be
#     one the client counted.
# And measures mouth -> ear through the client and the server (as scripts/e2e-chat.sh does for
# chat): input sample i is captured at mic-recording time L + i, is model input sample i + R, and
# the answer to it (model output sample i + R) is played at speaker-recording time S + i + R, so
# the delay is S + R - L (both recordings start together, within a few ms). Minus the 80 ms
# frame and the compute, the rest is what the client's devices (1920-sample blocks both ways),
# Opus, the network and the server add.
# Usage: bash scripts/serve-clients/python-client-e2e.sh
# Env: MOSHI_RS (binary, default target/debug/moshi-rs), E2E_OUT (output folder, default a temp
#      folder), SERVE_VENV (default target/serve-clients/venv), MIN_NCC (default 0.99),
#      E2E_SERVER (host:port: connect there, e.g. a load balancer, instead of starting a server;
#      the server behind it is `serve --model assets/tiny-a --greedy --record $E2E_OUT/record`,
#      one session, started and stopped by the caller).
# Exit: 0 passed; 3 a check failed while the client's own audio device reported an underrun
# (ALSA's "underrun occurred": the client was starved of CPU, e.g. on a loaded machine, and its
# side counted it; the caller may try again); any other code: failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
MOSHI_RS=${MOSHI_RS:-$ROOT/target/debug/moshi-rs}
VENV=${SERVE_VENV:-$ROOT/target/serve-clients/venv}
MIN_NCC=${MIN_NCC:-0.99}
OUT=${E2E_OUT:-$(mktemp -d /tmp/moshi-rs-serve-py.XXXXXX)}
mkdir -p "$OUT/record"
export VA_DIR=${VA_DIR:-$OUT/va}
export VA_RATE=24000
VA="bash $ROOT/scripts/virtual-audio.sh"
INPUT=$ROOT/assets/tiny-a/input.wav
CHECK="$VENV/bin/python $ROOT/scripts/serve-clients/audio_check.py"

[ -x "$MOSHI_RS" ] || { echo "python-client-e2e: $MOSHI_RS not built" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || { echo "python-client-e2e: no venv at $VENV (bash scripts/setup.sh --serve-e2e)" >&2; exit 2; }

SERVER=""
CLIENT=""
cleanup() {
    [ -n "$CLIENT" ] && kill -INT "$CLIENT" 2>/dev/null || true
    [ -n "$SERVER" ] && kill -INT "$SERVER" 2>/dev/null || true
    $VA stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

$VA start
eval "$($VA env)"

if [ -n "${E2E_SERVER:-}" ]; then
    HOST=${E2E_SERVER%:*}
    PORT=${E2E_SERVER##*:}
    : >"$OUT/server.stderr"
else
    "$MOSHI_RS" --log moshi_server=info serve --model "$ROOT/assets/tiny-a" --greedy --static none \
        --port 0 --record "$OUT/record" >"$OUT/server.stdout" 2>"$OUT/server.stderr" &
    SERVER=$!
    for _ in $(seq 1 600); do grep -q 'moshi-rs serve: open' "$OUT/server.stdout" 2>/dev/null && break; sleep 0.1; done
    URL=$(sed -n 's/^moshi-rs serve: open //p' "$OUT/server.stdout")
    [ -n "$URL" ] || { echo "python-client-e2e: the server did not start:" >&2; cat "$OUT/server.stderr" >&2; exit 1; }
    HOST=127.0.0.1
    PORT=$(echo "$URL" | sed -E 's#.*:([0-9]+)/?$#\1#')
fi

$VA record-start "$OUT/speaker.wav" 24000 va_speaker.monitor speaker
$VA record-start "$OUT/mic.wav" 24000 va_micfeed.monitor mic
sleep 0.3
# stdout is not a terminal: the client prints raw text and its log lines.
PYTHONUNBUFFERED=1 "$VENV/bin/python" "$ROOT/scripts/serve-clients/kyutai_python_client.py" --host "$HOST" --port "$PORT" \
    >"$OUT/client.stdout" 2>"$OUT/client.stderr" &
CLIENT=$!
for _ in $(seq 1 100); do cat "$OUT/client.stdout" "$OUT/client.stderr" 2>/dev/null | grep -q 'connected!' && break; sleep 0.1; done
cat "$OUT/client.stdout" "$OUT/client.stderr" | grep -q 'connected!' || { echo "python-client-e2e: the client did not connect:" >&2; cat "$OUT/client.stdout" "$OUT/client.stderr" >&2; exit 1; }
sleep 0.5
$VA inject "$INPUT"
sleep 1.5   # the last answers travel back and play
kill -INT "$CLIENT"
for _ in $(seq 1 50); do kill -0 "$CLIENT" 2>/dev/null || break; sleep 0.1; done
kill -KILL "$CLIENT" 2>/dev/null || true
CLIENT=""
sleep 0.3
$VA record-stop speaker
$VA record-stop mic
for _ in $(seq 1 50); do ls "$OUT"/record/*-{in,out}.wav "$OUT"/record/*-stats.json >/dev/null 2>&1 && break; sleep 0.1; done
if [ -n "$SERVER" ]; then
    kill -INT "$SERVER"
    wait "$SERVER" || { echo "python-client-e2e: the server did not exit cleanly" >&2; cat "$OUT/server.stderr" >&2; exit 1; }
    SERVER=""
fi

echo "--- server log"; grep -v '^ALSA lib' "$OUT/server.stderr" || true
echo "--- client output"; tr -d "\r" <"$OUT/client.stderr" | tail -n 20; echo "--- words the client printed"; head -c 600 "$OUT/client.stdout"; echo
HEARD=$(ls "$OUT"/record/*-in.wav)
SENT=$(ls "$OUT"/record/*-out.wav)
STATS=$(ls "$OUT"/record/*-stats.json)
echo "--- the server's session counters"; cat "$STATS"
DROPPED=$("$VENV/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["input_frames_dropped"])' "$STATS")
UNDERRUNS=$(grep -c 'underrun occurred' "$OUT/client.stderr" || true)
# A failed check is a glitch the client counted when its audio device reported an underrun.
failed() {
    if [ "$UNDERRUNS" -gt 0 ]; then
        echo "python-client-e2e: GLITCHED: $1, and the client's audio device reported $UNDERRUNS underrun(s)" >&2; exit 3
    fi
    echo "python-client-e2e: FAILED: $1" >&2; exit 1
}
echo "--- the server decoded the speech it was given (the microphone feed in what the model processed; $DROPPED input frames dropped)"
$CHECK heard "$OUT/mic.wav" "$HEARD" --min-ncc 0.9 --min-windows 4 --allowed-low "$DROPPED" || failed "the server did not hear the microphone"
HEARD_CMP=$($CHECK find "$INPUT" "$HEARD")
MIC_CMP=$($CHECK find "$INPUT" "$OUT/mic.wav")
echo "input.wav in what the model processed: $HEARD_CMP; in the microphone feed: $MIC_CMP"
LAGS=$(grep -o "\[LAG\]" "$OUT/client.stderr" | wc -l)
echo "--- the client's speaker played what the server sent: constant lag (+-2 samples), ncc >= $MIN_NCC in every window"
echo "the client printed [LAG] $LAGS times (its speaker had nothing to play; at the start too), ALSA reported $UNDERRUNS underruns in the client"
CHECKED=$($CHECK windows "$SENT" "$OUT/speaker.wav" --min-ncc "$MIN_NCC" --tolerance 2 --client-blocks 1920 --min-windows 10) || {
    echo "$CHECKED"; failed "the speaker did not play the audio sent"; }
echo "$CHECKED"
lag() { sed -n "s/^lag=\([-0-9]*\).*/\1/p" <<<"$1" | head -n 1; }
"$VENV/bin/python" - "$(lag "$CHECKED")" "$(lag "$HEARD_CMP")" "$(lag "$MIC_CMP")" "$STATS" <<'PY'
import json, sys
s, r, l = (int(v) for v in sys.argv[1:4])
compute_ms = json.load(open(sys.argv[4]))["compute_ms_per_frame"]
delay_ms = (s + r - l) / 24.0
print(f"mouth -> ear through Kyutai's Python client: {delay_ms:.1f} ms = 80 ms frame + {compute_ms:.1f} ms compute "
      f"+ {delay_ms - 80 - compute_ms:.1f} ms added by the client's devices, Opus, the network and the server "
      f"(before any [LAG] block inside the conversation: each adds 80 ms from there on)")
PY
INSERTED=$(echo "$CHECKED" | sed -n 's/^inserted_blocks=\([0-9]*\).*/\1/p')
[ "$INSERTED" -le "$LAGS" ] || { echo "python-client-e2e: FAILED: $INSERTED blocks of silence inside the conversation, the client counted $LAGS" >&2; exit 1; }
echo "python client e2e: OK: $INSERTED silent blocks inside the conversation, all counted by the client ($OUT)"
