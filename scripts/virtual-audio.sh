#!/usr/bin/env bash
# virtual-audio.sh: a virtual microphone and speaker for end-to-end tests of `moshi-rs chat`
# on a machine with no sound card (CI, containers).
#
# A private PulseAudio daemon (user mode, root allowed, no systemd/D-Bus, anonymous auth on its
# own socket under $VA_DIR) with two clocked null sinks:
#   va_speaker          default sink   = the speaker; recorded through va_speaker.monitor
#   va_micfeed          sink a test plays a WAV into
#   va_micfeed.monitor  default source = the microphone the program captures
#   room (optional)     the acoustic path of a laptop: the speaker's output mixed back into the
#                       microphone (module-loopback va_speaker.monitor -> va_micfeed),
#                       attenuated and delayed: `room-start DELAY_MS GAIN_DB`
# ALSA's `default` PCM is routed to that daemon (libasound2-plugins' pulse plugin), so cpal's
# default devices are the virtual mic and speaker. At VA_RATE=24000 (default) nothing is
# resampled anywhere: the speaker recording is sample-exact.
#
# Usage: virtual-audio.sh install | start | env | status | stop
#        virtual-audio.sh inject IN.wav                      (blocks while it plays)
#        virtual-audio.sh record-start OUT.wav [RATE] [SOURCE] [TAG]  ; ... ; record-stop [TAG]
#        virtual-audio.sh compare REF.wav REC.wav [MIN_NCC]   (exit 0 if ncc >= MIN_NCC)
#        virtual-audio.sh room-start [DELAY_MS] [GAIN_DB] ; ... ; room-stop   (default 40 ms, -6 dB)
# Environment: VA_DIR (state folder, default /tmp/moshi-rs-va), VA_RATE (default 24000),
# VA_LOG_LEVEL (the daemon's log level, default notice; debug logs every stream underrun).
#
# Pitfalls this handles (all observed on Debian 12, PulseAudio 16.1, cpal over ALSA):
# - null sinks need norewinds=1, or they run in 2 s blocks (capture starts ~1-2 s late);
# - clients need PULSE_SERVER (+ client.conf, + an ALSA config routing `default` to pulse);
# - `pulseaudio --daemonize=no ... &` with every fd redirected, so $! is the daemon and
#   `$(...)`/CI pipes never hang; processes are only ever stopped by their recorded PID;
# - paplay keeps its default (large) buffer: a 20 ms buffer underruns on a busy CPU;
# - parecord uses --latency-msec=20 and is stopped with SIGINT (it then writes the header);
# - the daemon runs with real-time scheduling for its device threads (--realtime=yes
#   --high-priority=yes, what a desktop's PulseAudio gets through rtkit; as root, or with
#   RLIMIT_RTPRIO, it takes SCHED_RR itself, else it warns and runs without): at normal priority
#   any CPU burst on a 2-core VM starved the virtual devices themselves, and `chat` (rightly)
#   counted the glitches they made: 5 of 6 e2e runs glitched, 2 of 6 with it, interleaved.
set -u

VA_DIR=${VA_DIR:-/tmp/moshi-rs-va}
VA_RATE=${VA_RATE:-24000}
VA_SOCK="$VA_DIR/native"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { echo "[virtual-audio] $*" >&2; }

va_env() {
    cat <<ENV
export PULSE_SERVER=unix:$VA_SOCK
export PULSE_CLIENTCONFIG=$VA_DIR/client.conf
export ALSA_CONFIG_PATH=/usr/share/alsa/alsa.conf:$VA_DIR/asound.conf
ENV
}

client() {
    env PULSE_SERVER="unix:$VA_SOCK" PULSE_CLIENTCONFIG="$VA_DIR/client.conf" \
        ALSA_CONFIG_PATH="/usr/share/alsa/alsa.conf:$VA_DIR/asound.conf" "$@"
}

# PID from a pid file if that process is alive (not a zombie) and runs the expected program.
pid_of() {
    local f=$1 comm=$2 pid
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && echo "$pid"
}

va_start() {
    local pid t0 i
    if pid=$(pid_of "$VA_DIR/pulseaudio.pid" pulseaudio); then
        log "already running (pid $pid)"; return 0
    fi
    command -v pulseaudio >/dev/null || { log "pulseaudio is not installed: run 'bash scripts/setup.sh --audio-e2e'"; return 1; }
    mkdir -p "$VA_DIR/run" "$VA_DIR/state"
    chmod 700 "$VA_DIR/run" "$VA_DIR/state"
    cat >"$VA_DIR/va.pa" <<PA
load-module module-native-protocol-unix auth-anonymous=1 socket=$VA_SOCK
load-module module-null-sink sink_name=va_speaker rate=$VA_RATE channels=1 format=float32le norewinds=1 sink_properties=device.description=VirtualSpeaker
load-module module-null-sink sink_name=va_micfeed rate=$VA_RATE channels=1 format=float32le norewinds=1 sink_properties=device.description=VirtualMicFeed
set-default-sink va_speaker
set-default-source va_micfeed.monitor
PA
    printf 'autospawn = no\ndefault-server = unix:%s\n' "$VA_SOCK" >"$VA_DIR/client.conf"
    printf 'pcm.!default { type pulse }\nctl.!default { type pulse }\n' >"$VA_DIR/asound.conf"
    t0=$(date +%s%N)
    XDG_RUNTIME_DIR="$VA_DIR/run" PULSE_RUNTIME_PATH="$VA_DIR/run" PULSE_STATE_PATH="$VA_DIR/state" \
    XDG_CONFIG_HOME="$VA_DIR/state" PULSE_CLIENTCONFIG="$VA_DIR/client.conf" \
        pulseaudio -n -F "$VA_DIR/va.pa" --daemonize=no --system=no --use-pid-file=no \
            --exit-idle-time=-1 --realtime=yes --high-priority=yes --log-target=stderr --log-level=${VA_LOG_LEVEL:-notice} --log-time=yes \
            </dev/null >"$VA_DIR/pulseaudio.log" 2>&1 &
    echo $! >"$VA_DIR/pulseaudio.pid"
    for i in $(seq 1 200); do
        if client pactl info >/dev/null 2>&1; then
            log "pulseaudio up (pid $(cat "$VA_DIR/pulseaudio.pid")) after $(( ($(date +%s%N) - t0) / 1000000 )) ms, devices at $VA_RATE Hz mono"
            return 0
        fi
        pid_of "$VA_DIR/pulseaudio.pid" pulseaudio >/dev/null || { log "pulseaudio exited:"; cat "$VA_DIR/pulseaudio.log" >&2; return 1; }
        sleep 0.05
    done
    log "pulseaudio did not answer within 10 s"; va_stop; return 1
}

va_status() {
    local pid
    pid=$(pid_of "$VA_DIR/pulseaudio.pid" pulseaudio) || { echo "not running"; return 1; }
    echo "pulseaudio pid $pid, socket $VA_SOCK"
    client pactl list short sinks; client pactl list short sources
}

va_inject() { client paplay --device=va_micfeed "$1"; }

va_record_start() {
    local out=$1 rate=${2:-24000} source=${3:-va_speaker.monitor} tag=${4:-speaker}
    env PULSE_SERVER="unix:$VA_SOCK" PULSE_CLIENTCONFIG="$VA_DIR/client.conf" \
        parecord --device="$source" --rate="$rate" --channels=1 --format=s16le --file-format=wav \
        --latency-msec=20 "$out" </dev/null >"$VA_DIR/parecord-$tag.log" 2>&1 &
    echo $! >"$VA_DIR/parecord-$tag.pid"
}

va_record_stop() {
    local tag=${1:-speaker} pid i
    pid=$(pid_of "$VA_DIR/parecord-$tag.pid" parecord) || { log "no recording '$tag' running"; return 1; }
    kill -INT "$pid"
    for i in $(seq 1 100); do [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || break; sleep 0.05; done
    rm -f "$VA_DIR/parecord-$tag.pid"
}

# The acoustic path: what the speaker plays comes back into the microphone DELAY_MS later (the
# loopback's latency target; it keeps it by adapting its rate) at GAIN_DB (software volume of
# its stream, exact in dB), mixed with whatever a test injects.
va_room_start() {
    local delay_ms=${1:-40} gain_db=${2:--6} module input i
    module=$(client pactl load-module module-loopback source=va_speaker.monitor sink=va_micfeed \
        latency_msec="$delay_ms" adjust_time=0 source_dont_move=true sink_dont_move=true remix=no) \
        || { log "could not load the room's loopback"; return 1; }
    echo "$module" >"$VA_DIR/room.module"
    for i in $(seq 1 100); do
        input=$(client pactl list sink-inputs | awk -v m="$module" \
            '/^Sink Input #/ {id = substr($3, 2)} /Owner Module:/ && $3 == m {print id}')
        [ -n "$input" ] && break
        sleep 0.02
    done
    [ -n "$input" ] || { log "the room's loopback has no stream"; va_room_stop; return 1; }
    client pactl set-sink-input-volume "$input" "${gain_db}dB"
    log "room: speaker -> microphone, ${delay_ms} ms, ${gain_db} dB (module $module)"
}

va_room_stop() {
    [ -s "$VA_DIR/room.module" ] || return 0
    client pactl unload-module "$(cat "$VA_DIR/room.module")" || true
    rm -f "$VA_DIR/room.module"
}

va_stop() {
    local f pid i
    for f in "$VA_DIR"/parecord-*.pid; do
        [ -e "$f" ] || continue
        if pid=$(pid_of "$f" parecord); then kill -INT "$pid"; fi
        rm -f "$f"
    done
    rm -f "$VA_DIR/room.module"
    if pid=$(pid_of "$VA_DIR/pulseaudio.pid" pulseaudio); then
        kill -TERM "$pid"
        for i in $(seq 1 60); do pid_of "$VA_DIR/pulseaudio.pid" pulseaudio >/dev/null || break; sleep 0.05; done
        if pid_of "$VA_DIR/pulseaudio.pid" pulseaudio >/dev/null; then kill -KILL "$pid"; fi
        log "stopped pulseaudio (pid $pid)"
    fi
    rm -f "$VA_DIR/pulseaudio.pid"
    rm -rf "$VA_DIR/run" "$VA_SOCK"
}

# A python3 that has numpy (a pyenv shim may lack it while the system python has it).
numpy_python() {
    local p
    for p in python3 /usr/bin/python3; do
        if "$p" -c 'import numpy' 2>/dev/null; then echo "$p"; return 0; fi
    done
    log "numpy is not available: run 'bash scripts/setup.sh --audio-e2e'"; return 1
}

# Finds REF inside REC (FFT cross-correlation) and prints key=value pairs: lag (samples, REC
# later than REF when > 0), ncc over the overlap, snr_db, dropouts_10ms (loud 10 ms blocks of REF
# that are near-silent in REC), windows_ok (loud 250 ms windows that match after re-alignment
# within +-250 ms), shift_spread_ms, lag_jumps (consecutive matched windows whose lags differ by
# more than 2 samples: inserted or lost samples), jump_samples (each jump, + = inserted) and
# min_window_ncc. Exit 0 if ncc >= MIN_NCC.
va_compare() {
    local py
    py=$(numpy_python) || return 2
    "$py" - "$@" <<'PY'
import sys, wave
import numpy as np
def load(p):
    with wave.open(p) as w:
        assert w.getsampwidth() == 2, f"{p}: need 16-bit PCM"
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
        if w.getnchannels() > 1:
            x = x.reshape(-1, w.getnchannels()).mean(axis=1)
        return x, w.getframerate()
ref, rr = load(sys.argv[1]); rec, rc = load(sys.argv[2])
thr = float(sys.argv[3]) if len(sys.argv) > 3 else 0.9
if rr != rc:
    sys.exit(f"sample rates differ: {rr} vs {rc}")
n = len(ref) + len(rec); nfft = 1 << (n - 1).bit_length()
c = np.fft.irfft(np.fft.rfft(rec, nfft) * np.conj(np.fft.rfft(ref, nfft)), nfft)
c = np.concatenate([c[nfft - len(ref) + 1:], c[:len(rec)]])
lag = int(np.argmax(c)) - (len(ref) - 1)
r0, s0 = (0, lag) if lag >= 0 else (-lag, 0)
m = min(len(ref) - r0, len(rec) - s0)
r, s = ref[r0:r0 + m], rec[s0:s0 + m]
den = np.linalg.norm(s) * np.linalg.norm(r)
ncc = float(np.dot(s, r) / den) if den > 0 else 0.0
gain = float(np.dot(s, r) / max(np.dot(r, r), 1e-12))
res = s - gain * r
snr = 10 * np.log10(max(np.dot(gain * r, gain * r), 1e-12) / max(np.dot(res, res), 1e-12))
b = rr // 100; loud = drops = 0
for i in range(m // b):
    er = np.sqrt(np.mean(r[i*b:(i+1)*b] ** 2))
    if er > 0.02:
        loud += 1
        drops += int(np.sqrt(np.mean(s[i*b:(i+1)*b] ** 2)) < 0.1 * er)
W = rr // 4; wins = ok = 0; shifts = []; window_nccs = []
for st in range(r0, r0 + m - W, W):
    seg = ref[st:st + W]
    if np.sqrt(np.mean(seg ** 2)) < 0.01:
        continue
    a0 = max(0, st + lag - W); a1 = min(len(rec), st + lag + 2 * W)
    x = rec[a0:a1]; wins += 1
    if len(x) < W:
        continue
    cc = np.correlate(x, seg, mode="valid")
    en = np.sqrt(np.convolve(x ** 2, np.ones(W), mode="valid")) * np.linalg.norm(seg) + 1e-12
    k = int(np.argmax(cc / en))
    window_nccs.append(float(cc[k] / en[k]))
    if cc[k] / en[k] >= 0.9:
        ok += 1; shifts.append(a0 + k - st - lag)
spread = (max(shifts) - min(shifts)) if shifts else 0
# A clean path plays every window at one lag: a change of more than 2 samples between
# consecutive matched windows is a discontinuity (samples inserted or lost) a listener hears.
jumps = [b - a for a, b in zip(shifts, shifts[1:]) if abs(b - a) > 2]
min_wncc = min(window_nccs) if window_nccs else 0.0
print(f"lag={lag} lag_ms={1000*lag/rr:.2f} ncc={ncc:.4f} gain={gain:.3f} snr_db={snr:.1f} "
      f"dropouts_10ms={drops}/{loud} windows_ok={ok}/{wins} shift_spread_ms={1000*spread/rr:.1f} "
      f"lag_jumps={len(jumps)} jump_samples={','.join(map(str, jumps)) or 'none'} min_window_ncc={min_wncc:.4f}")
sys.exit(0 if ncc >= thr else 1)
PY
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    cmd=${1:-}; shift || true
    case "$cmd" in
        install) bash "$HERE/setup.sh" --audio-e2e ;;
        start) va_start ;;
        env) va_env ;;
        status) va_status ;;
        inject) va_inject "$@" ;;
        record-start) va_record_start "$@" ;;
        record-stop) va_record_stop "$@" ;;
        compare) va_compare "$@" ;;
        room-start) va_room_start "$@" ;;
        room-stop) va_room_stop ;;
        stop) va_stop ;;
        *) sed -n '2,24p' "$0"; exit 2 ;;
    esac
fi
