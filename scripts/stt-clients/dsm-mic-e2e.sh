#!/usr/bin/env bash
# dsm-mic-e2e.sh: Kyutai's microphone speech-to-text client, stt_from_mic_rust_server.py
# (kyutai-labs/delayed-streams-modeling f6074cb, run unmodified from ../shared/clients/dsm),
# against a server already listening at $URL (websocket /api/asr-streaming), its microphone a
# virtual PulseAudio one (scripts/virtual-audio.sh) into which IN.wav is played.
#
# The client opens the default input device (sounddevice: 24 kHz mono, 1920-sample blocks), connects,
# prints "Starting the transcription", then sends each block as {"type": "Audio", "pcm": [...]}
# and prints every Word's text (and "| " when Step.prs[2], the 2 s pause head, passes 0.5 after a
# word, with --show-vad). It never ends by itself: it streams the microphone until Ctrl+C. Here,
# once it is connected, IN.wav is played into the microphone (paplay, in real time), then TAIL_S
# seconds of the microphone's silence flush the model's delay, then it gets SIGINT: its handler
# prints "Interrupted by user" and exits 0 (it is killed, and this fails, if it has not exited 5 s
# later).
#
# Usage: URL=ws://127.0.0.1:PORT bash scripts/stt-clients/dsm-mic-e2e.sh [IN.wav]
#        (IN.wav default assets/tiny-stt/input.wav; any rate: paplay converts it to 24 kHz)
# Env: URL        the server's root, ws://HOST:PORT (the client appends /api/asr-streaming)
#      API_KEY    sent as the kyutai-api-key header (default public_token, the client's default)
#      E2E_OUT    output folder (default a new temp folder)
#      STT_VENV   Python venv (default target/stt-clients/venv: bash scripts/setup.sh --serve-e2e)
#      DSM_DIR    Kyutai's scripts (default ../shared/clients/dsm)
#      TAIL_S     microphone silence after the WAV before SIGINT (default 3; more than the delay)
#      SHOW_VAD   1 (default): run with --show-vad (reads Step.prs[2]); 0 for a model without
#                 the voice-activity heads
#      MIN_WORDS  fewest words the client must print (default 1)
# Writes to $E2E_OUT: client.stdout / client.stderr (the client's own output), words.txt (what it
# printed between "Starting the transcription" and "Interrupted by user", one line), mic.wav (what
# the virtual microphone delivered, 24 kHz 16-bit).
# Exit: 0 passed; 1 failed (the message says what); 2 something it needs is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
IN=${1:-$ROOT/assets/tiny-stt/input.wav}
VENV=${STT_VENV:-$ROOT/target/stt-clients/venv}
DSM_DIR=${DSM_DIR:-$ROOT/../shared/clients/dsm}
CLIENT_PY=$DSM_DIR/stt_from_mic_rust_server.py
API_KEY=${API_KEY:-public_token}
TAIL_S=${TAIL_S:-3}
SHOW_VAD=${SHOW_VAD:-1}
MIN_WORDS=${MIN_WORDS:-1}
OUT=${E2E_OUT:-$(mktemp -d /tmp/moshi-rs-dsm-mic.XXXXXX)}
mkdir -p "$OUT"
export VA_DIR=${VA_DIR:-$OUT/va}
export VA_RATE=24000
VA="bash $ROOT/scripts/virtual-audio.sh"

die() { echo "dsm-mic-e2e: $1" >&2; exit "${2:-1}"; }
[[ ${URL:-} =~ ^wss?://[^/]+$ ]] || die "URL must be the server's root, ws://HOST:PORT, got '${URL:-}'" 2
[ -x "$VENV/bin/python" ] || die "no venv at $VENV (bash scripts/setup.sh --serve-e2e)" 2
[ -f "$CLIENT_PY" ] || die "Kyutai's client is not at $CLIENT_PY (set DSM_DIR)" 2
[ -f "$IN" ] || die "no input WAV at $IN" 2
for tool in pulseaudio paplay parecord pactl; do
    command -v "$tool" >/dev/null || die "$tool is not installed (bash scripts/setup.sh --audio-e2e)" 2
done

CLIENT=""
cleanup() {
    [ -n "$CLIENT" ] && kill -KILL "$CLIENT" 2>/dev/null || true
    $VA stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

show() { echo "--- client stdout"; cat "$OUT/client.stdout"; echo; echo "--- client stderr"; cat "$OUT/client.stderr"; }
alive() { kill -0 "$CLIENT" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$CLIENT/stat" 2>/dev/null)" != Z ]; }

$VA start
eval "$($VA env)"
$VA record-start "$OUT/mic.wav" 24000 va_micfeed.monitor mic

args=(--url "$URL" --api-key "$API_KEY")
[ "$SHOW_VAD" = 1 ] && args+=(--show-vad)
# stdout is a file: unbuffered, so that "Starting the transcription" shows when it is printed.
PYTHONUNBUFFERED=1 "$VENV/bin/python" "$CLIENT_PY" "${args[@]}" >"$OUT/client.stdout" 2>"$OUT/client.stderr" &
CLIENT=$!
for _ in $(seq 1 300); do
    grep -q 'Starting the transcription' "$OUT/client.stdout" && break
    alive || { show >&2; die "the client exited before it connected to $URL/api/asr-streaming"; }
    sleep 0.1
done
grep -q 'Starting the transcription' "$OUT/client.stdout" || { show >&2; die "the client did not connect within 30 s"; }

sleep 0.5
$VA inject "$IN"
sleep "$TAIL_S"
alive || { show >&2; die "the client exited while it was transcribing"; }
kill -INT "$CLIENT"
for _ in $(seq 1 50); do alive || break; sleep 0.1; done
alive && { show >&2; die "the client was still running 5 s after SIGINT"; }
set +e; wait "$CLIENT"; status=$?; set -e
CLIENT=""
$VA record-stop mic

show
[ "$status" -eq 0 ] || die "the client exited with status $status"
! grep -q 'Connection closed' "$OUT/client.stdout" || die "the connection closed under the client"
grep -q 'Interrupted by user' "$OUT/client.stdout" || die "the client did not print 'Interrupted by user' on SIGINT"
sed -n '/Starting the transcription/,$p' "$OUT/client.stdout" | sed '1d' | tr '\n' ' ' |
    sed -e 's/Interrupted by user.*//' -e 's/  */ /g' -e 's/^ //' -e 's/ $//' >"$OUT/words.txt"
WORDS=$(tr ' ' '\n' <"$OUT/words.txt" | grep -cv -e '^|$' -e '^$' || true)
echo "--- words ($WORDS): $(cat "$OUT/words.txt")"
[ "$WORDS" -ge "$MIN_WORDS" ] || die "the client printed $WORDS words, expected at least $MIN_WORDS"
echo "dsm mic e2e: OK: $WORDS words from Kyutai's microphone client ($OUT)"
