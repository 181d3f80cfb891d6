#!/usr/bin/env bash
# e2e-chat.sh: end-to-end test of `moshi-rs chat` on virtual devices (scripts/virtual-audio.sh).
# Plays assets/tiny-a/input.wav into the virtual microphone while `moshi-rs chat --model
# assets/tiny-a` runs, records the virtual speaker (and the microphone feed), then checks:
#   - the speaker recording matches what the engine produced (right channel of --record):
#     normalised cross-correlation >= MIN_NCC, every loud 250 ms window found;
#   - no silent glitch: a clean path plays every window at one lag (within 2 samples) with
#     window ncc >= 0.99; each lag jump (samples inserted or lost on the way to the speaker)
#     must have been counted by the engine (`audible_glitch_events`);
#   - a run whose speaker or engine input does not match (low ncc, a window missing) glitched:
#     it exits 3 if the engine counted a glitch, fails if it counted none;
#   - no uncounted steady-state underruns, no dropped frames, no allocation in the audio callbacks;
# and measures the latency the runtime adds (mic sample in -> the speaker sample answering it,
# minus the model's 80 ms frame and its compute time). Echo cancellation is off: there is no
# acoustic path here (as on headphones), and the engine's input must be the injected speech as
# captured (scripts/e2e-chat-echo.sh tests the canceller).
# Exit 0: clean; 3: glitched, and the engine counted every glitch; other: failure.
# Usage: bash scripts/e2e-chat.sh [BUFFER_MS]   (env: MOSHI_RS = binary, default target/debug/moshi-rs;
#        E2E_OUT = folder for the recordings, default a temp folder; MIN_NCC default 0.95;
#        E2E_MODEL = model folder, default assets/tiny-a (assets/tiny-hibiki: live translation);
#        E2E_CHAT_ARGS = extra chat options, e.g. "--cfg-coef 3")
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUFFER_MS=${1:-40}
MOSHI_RS=${MOSHI_RS:-$ROOT/target/debug/moshi-rs}
MIN_NCC=${MIN_NCC:-0.95}
OUT=${E2E_OUT:-$(mktemp -d /tmp/moshi-rs-e2e.XXXXXX)}
mkdir -p "$OUT"
export VA_DIR=${VA_DIR:-$OUT/va}
export VA_RATE=24000
VA="bash $ROOT/scripts/virtual-audio.sh"
MODEL=${E2E_MODEL:-$ROOT/assets/tiny-a}
INPUT=$MODEL/input.wav

[ -x "$MOSHI_RS" ] || { echo "e2e: $MOSHI_RS not built (cargo build -p moshi-cli)" >&2; exit 2; }
cleanup() { $VA stop >/dev/null 2>&1 || true; }
trap cleanup EXIT

$VA start
eval "$($VA env)"
$VA record-start "$OUT/speaker.wav" 24000 va_speaker.monitor speaker
$VA record-start "$OUT/mic.wav" 24000 va_micfeed.monitor mic
sleep 0.3
# shellcheck disable=SC2086 # E2E_CHAT_ARGS holds several options
"$MOSHI_RS" chat --model "$MODEL" --greedy --buffer-ms "$BUFFER_MS" --duration-s 6 --echo-cancel off ${JITTER_MS:+--jitter-ms $JITTER_MS} ${E2E_CHAT_ARGS:-} \
    --record "$OUT/record.wav" --stats-json "$OUT/stats.json" --profile "$OUT/profile.jsonl" \
    >"$OUT/chat.stdout" 2>"$OUT/chat.stderr" &
CHAT=$!
# Wait until the streams run, then speak into the microphone.
for _ in $(seq 1 100); do grep -q listening "$OUT/chat.stderr" 2>/dev/null && break; sleep 0.05; done
sleep 0.5
$VA inject "$INPUT"
wait "$CHAT" || { echo "e2e: moshi-rs chat failed:" >&2; cat "$OUT/chat.stderr" >&2; exit 1; }
sleep 0.4   # the last output still travels through the device buffers
$VA record-stop speaker
$VA record-stop mic
cat "$OUT/chat.stderr" | grep -v '^ALSA lib' >&2 || true

# Engine's own streams from --record: left = what it heard, right = what it said.
sox "$OUT/record.wav" "$OUT/user.wav" remix 1
sox "$OUT/record.wav" "$OUT/moshi.wav" remix 2

kv() { sed -n "s/.*\b$1=\([-0-9.]*\).*/\1/p" <<<"$2"; }
# The speaker and the engine's input may differ from the reference only where the engine counted
# a glitch: their mismatches are judged below, against the engine's counters.
speaker_ok=1; speaker_cmp=$($VA compare "$OUT/moshi.wav" "$OUT/speaker.wav" "$MIN_NCC") || speaker_ok=0
user_ok=1; user_cmp=$($VA compare "$INPUT" "$OUT/user.wav" 0.9) || user_ok=0
mic_cmp=$($VA compare "$INPUT" "$OUT/mic.wav" 0.9) || { echo "e2e: the injected speech is not in the mic feed: $mic_cmp" >&2; exit 1; }
echo "speaker vs engine output: $speaker_cmp"
echo "mic feed vs input.wav:    $mic_cmp"
echo "engine input vs input.wav: $user_cmp"
[ -n "$(kv lag "$speaker_cmp")" ] && [ -n "$(kv lag "$user_cmp")" ] || { echo "e2e: a recording could not be compared" >&2; exit 1; }
windows=$(sed -n 's/.*windows_ok=\([0-9]*\/[0-9]*\).*/\1/p' <<<"$speaker_cmp")
[ "${windows%/*}" = "${windows#*/}" ] || speaker_ok=0

PY=$(command -v python3)
"$PY" - "$OUT/stats.json" "$(kv lag "$speaker_cmp")" "$(kv lag "$mic_cmp")" "$(kv lag "$user_cmp")" "$BUFFER_MS" \
    "$(kv lag_jumps "$speaker_cmp")" "$(kv min_window_ncc "$speaker_cmp")" "$speaker_ok" "$user_ok" "$MIN_NCC" <<'PY'
import json, sys
stats = json.load(open(sys.argv[1]))
s_lag, l_lag, r_lag, buffer_ms, lag_jumps = (int(sys.argv[i]) for i in (2, 3, 4, 5, 6))
min_window_ncc = float(sys.argv[7])
speaker_ok, user_ok = sys.argv[8] == "1", sys.argv[9] == "1"
# Engine sample k: heard at mic-recording time L + (k - R), played at speaker-recording time S + k.
delay_ms = (s_lag + r_lag - l_lag) / 24.0
compute_ms = stats["real_time_factor"] * 80.0
added_ms = delay_ms - 80.0 - compute_ms
c = stats["counters"]
print(f"mic -> speaker delay {delay_ms:.1f} ms = 80 ms frame + {compute_ms:.1f} ms compute + {added_ms:.1f} ms added by the runtime "
      f"(buffer {buffer_ms} ms; engine's own estimate p50 {stats['added_latency_ms']['p50']:.1f} ms)")
print(f"frames {stats['frames_processed']} processed / {stats['frames_dropped']} dropped; underruns {c['underrun_events']} "
      f"({stats['steady_state_underrun_events']} steady state); device errors {c['device_errors']}; "
      f"callback allocations {stats['callback_allocations']}")
glitches = stats["audible_glitch_events"]
print(f"speaker vs engine output: {lag_jumps} lag jumps, every window ncc >= {min_window_ncc:.4f}; "
      f"glitches the engine counted: {glitches}")
print(json.dumps({"e2e_delay_ms": round(delay_ms, 1), "added_latency_ms": round(added_ms, 1), "buffer_ms": buffer_ms,
                  "lag_jumps": lag_jumps, "min_window_ncc": min_window_ncc, "audible_glitch_events": glitches}))
fail = []
if lag_jumps > glitches: fail.append(f"{lag_jumps} lag jumps on the speaker, only {glitches} glitches counted (a silent glitch)")
if min_window_ncc < 0.99 and glitches == 0: fail.append(f"a window matched at ncc {min_window_ncc:.4f} < 0.99 with no glitch counted")
if not speaker_ok and glitches == 0: fail.append(f"the speaker does not play the engine's output (ncc < {sys.argv[10]} or a window missing) and no glitch was counted")
if not user_ok and glitches == 0: fail.append("the engine's input does not match the injected speech and no glitch was counted")
if stats["steady_state_underrun_events"] > glitches: fail.append("steady-state underruns not counted as glitches")
if stats["frames_dropped"] != 0: fail.append("dropped frames")
if stats["callback_allocations"] not in (None, 0): fail.append("allocations in audio callbacks")
if stats["frames_processed"] < 60: fail.append("too few frames processed")
if fail:
    sys.exit("e2e: " + ", ".join(fail))
if lag_jumps or glitches or not speaker_ok or not user_ok:
    print(f"e2e chat: GLITCHED, every glitch counted ({lag_jumps} lag jumps, {glitches} counted; "
          f"speaker matches: {speaker_ok}, engine input matches: {user_ok})")
    sys.exit(3)
PY
echo "e2e chat: OK (artifacts in $OUT)"
