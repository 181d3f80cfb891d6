"""livekit_stt.py: drives the LiveKit agents plugin `livekit-plugins-kyutai-lasuite` (unmodified,
its streaming recognizer `STT().stream()`, as a LiveKit agent's `stt_node` uses it) against a
server speaking Kyutai moshi-server's `/api/asr-streaming` protocol, with no LiveKit server.

Usage (venv made by `bash scripts/setup.sh --serve-e2e`):
    target/stt-clients/venv/bin/python scripts/stt-clients/livekit_stt.py IN.wav \
        --url ws://127.0.0.1:PORT --api-key KEY [--speed X] [--flush-s S] [--timeout-s T]

It pushes IN.wav (any rate, any channel count: mixed down to mono, 16-bit, at its own rate; the
plugin's base class resamples to the 24 kHz the plugin asks for, with LiveKit's resampler) in
--frame-ms frames at real-time pace (x --speed), then --flush-s of silence, so that the model's
delay is flushed, then ends the input. Every speech event the stream yields is printed on stdout
as one JSON object a line: {"type", "text", "start_time", "end_time", "language", "received_s"}
(the last: seconds since the first frame was pushed). Once the input has ended and the server has
been quiet (no message of any kind) for --idle-s, the stream is closed (`aclose()`, as an agent
does at the end of its session) and a summary goes to stderr:
    livekit_stt: done {"events": N, "frames_pushed": N, "audio_s": S, "server_messages": {...}}
Exit: 0 done; 1 the stream failed (connection refused, HTTP 401, the server sent Error, closed
the connection or sent nothing at all, --timeout-s passed); 2 bad usage (unreadable WAV, empty API key).

What the plugin (0.0.6, lasuite/plugins/kyutai/stt.py) does on the wire:
- URL: `STT(base_url=...)` is the whole websocket URL, path included (default
  ws://127.0.0.1:8080/api/asr-streaming). Kyutai's DSM scripts take the server root and append
  /api/asr-streaming; --url here takes either form (a URL with no path gets /api/asr-streaming).
- Auth: header `kyutai-api-key: KEY` only (never ?auth_id=). `STT()` raises ValueError
  ("Kyutai API key is required") when neither api_key nor $KYUTAI_API_KEY is non-empty.
- Connects with aiohttp `ws_connect` (timeout: conn_options.timeout, 10 s), with the
  `http_session` given to `STT()`; without one it needs a LiveKit job context
  (`utils.http_context.http_session()` raises outside a job): this driver passes its own
  aiohttp session, and that is all the LiveKit machinery it needs (no LiveKit server, room,
  worker or job).
- Sends only `{"type": "Audio", "pcm": [f32 x 1920]}` (int16 / 32768, 80 ms at 24 kHz; the last
  one, on flush / end of input, may be shorter). No Init, no Marker, no OggOpus. It does not wait
  for Ready: audio goes out as soon as the socket is open.
- Of the server's messages it uses `Word` only: each becomes one FINAL_TRANSCRIPT event, one word,
  `SpeechData(language="-", text=Word.text, start_time=Word.start_time)`, end_time left at 0.
  `Marker` would become END_OF_SPEECH, but the plugin never sends a Marker, so a server only
  echoing markers never produces one. `Ready`, `Step` (its `prs`: the semantic VAD is unused;
  turn detection is left to the agent's VAD), `EndWord` and `Error` are dropped silently; any
  message must be a msgpack map with "type" or the plugin logs "failed to process kyutai message".
  No START_OF_SPEECH, INTERIM_TRANSCRIPT or RECOGNITION_USAGE events.
- Ending: after the input ends the plugin keeps reading until the server closes the socket;
  moshi-server never does (it answers pings from the client side and waits), so the stream only
  ends with `aclose()`. Connection errors (refused, 401: aiohttp WSServerHandshakeError) are not
  livekit APIErrors, so they are not retried: the stream raises them at once.
This driver watches the raw server messages only by wrapping the plugin's own handler
(`SpeechStream._process_stream_event`), which it still calls unchanged: to count them, to notice
an `Error` the plugin would swallow, and to know when the server has gone quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import urllib.parse

PROG = "livekit_stt"
ASR_PATH = "/api/asr-streaming"


def fail(msg: str, code: int = 1) -> int:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)
    return code


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("wav", help="input WAV (any rate and channel count)")
    ap.add_argument("--url", required=True,
                    help=f"ws://HOST:PORT (then {ASR_PATH} is appended) or the full websocket URL")
    ap.add_argument("--api-key", default=None,
                    help="sent as the kyutai-api-key header (default: $KYUTAI_API_KEY)")
    ap.add_argument("--speed", type=float, default=1.0, help="feed pace, x real time (default 1)")
    ap.add_argument("--frame-ms", type=float, default=20.0, help="pushed frame length (default 20)")
    ap.add_argument("--silence-before-s", type=float, default=0.0,
                    help="silence pushed before the WAV (default 0)")
    ap.add_argument("--flush-s", type=float, default=4.0,
                    help="silence pushed after the WAV; more than the model's delay (default 4)")
    ap.add_argument("--idle-s", type=float, default=2.0,
                    help="after the input ended, close once the server sent nothing this long "
                         "(default 2)")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="bound on the whole run (default: the audio's duration / speed + 30)")
    args = ap.parse_args()
    for name in ("speed", "frame_ms", "idle_s"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("silence_before_s", "flush_s"):
        if not getattr(args, name) >= 0:
            ap.error(f"--{name.replace('_', '-')} must be at least 0, got {getattr(args, name)}")
    if args.timeout_s is not None and not args.timeout_s > 0:
        ap.error(f"--timeout-s must be positive, got {args.timeout_s}")
    return args


def endpoint_url(url: str) -> str:
    """The plugin wants the full websocket URL; a bare ws://host:port gets the ASR path."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"--url: expected ws://HOST:PORT[/path], got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path=ASR_PATH)
    return urllib.parse.urlunsplit(parts)


def load_wav_int16(path: str):
    """The WAV mixed down to mono int16 at its own rate: what a LiveKit room track delivers."""
    import numpy as np
    import sphn

    pcm, sample_rate = sphn.read(path)  # (channels, samples) float32, the file's own rate
    if pcm.ndim != 2 or pcm.shape[1] == 0:
        raise ValueError(f"{path}: no audio samples (shape {pcm.shape})")
    mono = pcm.mean(axis=0)
    return np.clip(np.round(mono * 32768.0), -32768, 32767).astype(np.int16), int(sample_rate)


class ServerWatch:
    """Counts the server's messages as the plugin handles them (the plugin's handler still runs)."""

    def __init__(self, stream) -> None:
        self.counts: dict[str, int] = {}
        self.last_message_at = time.monotonic()
        self.error: str | None = None
        self.error_event = asyncio.Event()
        handle = getattr(stream, "_process_stream_event", None)
        if handle is None:
            raise RuntimeError("this plugin version has no SpeechStream._process_stream_event "
                               "to watch (written for livekit-plugins-kyutai-lasuite 0.0.6)")

        def watched(data: dict) -> None:
            self.last_message_at = time.monotonic()
            kind = str(data.get("type")) if isinstance(data, dict) else type(data).__name__
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if kind == "Error" and self.error is None:
                self.error = str(data.get("message"))
                self.error_event.set()
            handle(data)

        stream._process_stream_event = watched


def event_json(ev, started_at: float) -> str:
    out = {"type": ev.type.value}
    if ev.alternatives:
        alt = ev.alternatives[0]
        out.update(text=alt.text, start_time=alt.start_time, end_time=alt.end_time,
                   language=str(alt.language))
    out["received_s"] = round(time.monotonic() - started_at, 3)
    return json.dumps(out, ensure_ascii=False)


async def push_audio(stream, pcm16, sample_rate: int, args, started_at: float) -> int:
    """Pushes silence, the WAV, silence in frames at the paced wall-clock times; ends the input."""
    import numpy as np
    from livekit import rtc

    frame_len = max(1, round(sample_rate * args.frame_ms / 1000.0))
    audio = np.concatenate([
        np.zeros(round(args.silence_before_s * sample_rate), np.int16), pcm16,
        np.zeros(round(args.flush_s * sample_rate), np.int16)])
    pushed = 0
    for offset in range(0, len(audio), frame_len):
        due = started_at + offset / sample_rate / args.speed
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        chunk = audio[offset:offset + frame_len]
        stream.push_frame(rtc.AudioFrame(chunk.tobytes(), sample_rate, 1, len(chunk)))
        pushed += 1
    stream.end_input()
    return pushed


async def wait_quiet(watch: ServerWatch, idle_s: float) -> None:
    while (quiet := time.monotonic() - watch.last_message_at) < idle_s:
        await asyncio.sleep(idle_s - quiet + 0.01)


async def run(args) -> int:
    import aiohttp
    from lasuite.plugins.kyutai import STT

    try:
        url = endpoint_url(args.url)
    except ValueError as e:
        return fail(str(e), 2)
    try:
        pcm16, sample_rate = load_wav_int16(args.wav)
    except Exception as e:  # sphn raises plain exceptions with its decoder's message
        return fail(f"cannot read the WAV {args.wav}: {e}", 2)
    audio_s = args.silence_before_s + len(pcm16) / sample_rate + args.flush_s
    timeout_s = args.timeout_s if args.timeout_s is not None else audio_s / args.speed + 30.0
    api_key = args.api_key if args.api_key is not None else os.environ.get("KYUTAI_API_KEY", "")

    async with aiohttp.ClientSession() as session:
        try:
            stt = STT(api_key=api_key, base_url=url, http_session=session)
        except ValueError as e:
            return fail(f"the plugin refuses the API key (--api-key or $KYUTAI_API_KEY must be "
                        f"non-empty): {e}", 2)
        print(f"{PROG}: streaming {args.wav} ({len(pcm16) / sample_rate:.2f} s at {sample_rate} Hz"
              f", pushed at {args.speed:g}x real time) to {url}", file=sys.stderr, flush=True)
        stream = stt.stream()
        watch = ServerWatch(stream)
        started_at = time.monotonic()
        events = 0

        async def read_events() -> None:
            nonlocal events
            async for ev in stream:
                print(event_json(ev, started_at), flush=True)
                events += 1

        reader = asyncio.create_task(read_events())
        feeder = asyncio.create_task(push_audio(stream, pcm16, sample_rate, args, started_at))
        server_error = asyncio.create_task(watch.error_event.wait())
        timed_out = False
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wait({reader, feeder, server_error},
                                   return_when=asyncio.FIRST_COMPLETED)
                if feeder.done() and feeder.exception() is None and not server_error.done():
                    quiet = asyncio.create_task(wait_quiet(watch, args.idle_s))
                    await asyncio.wait({reader, quiet, server_error},
                                       return_when=asyncio.FIRST_COMPLETED)
                    quiet.cancel()
                elif feeder.done():
                    # push_frame fails once the plugin's task has died: its reason reaches the
                    # reader, a moment later
                    await asyncio.wait({reader}, timeout=1.0)
        except TimeoutError:
            timed_out = True
        ended_by_itself = reader.done()
        feeder.cancel()
        server_error.cancel()
        await stream.aclose()
        reader.cancel()
        await asyncio.gather(reader, feeder, server_error, return_exceptions=True)
        await stt.aclose()

        if watch.error is not None:
            return fail(f"the server sent Error {watch.error!r} (the plugin ignores it)")
        if ended_by_itself:
            exc = reader.exception()
            if exc is not None:
                return fail(f"the plugin's stream failed: {type(exc).__name__}: {exc}")
            return fail("the server closed the connection before the input was drained "
                        f"(after {events} events; it sent {watch.counts})")
        if timed_out:
            return fail(f"timed out after {timeout_s:g} s (--timeout-s); the server sent "
                        f"{watch.counts}")
        if feeder.exception() is not None:
            exc = feeder.exception()
            return fail(f"pushing audio failed: {type(exc).__name__}: {exc}")
        if not watch.counts:
            return fail(f"the server sent no message at all (not even Ready) for the {audio_s:.2f} s "
                        f"of audio pushed to it and {args.idle_s:g} s after")
        frames_pushed = feeder.result()
        summary = {"events": events, "frames_pushed": frames_pushed,
                   "audio_s": round(audio_s, 3), "server_messages": watch.counts}
        print(f"{PROG}: done {json.dumps(summary)}", file=sys.stderr, flush=True)
        return 0


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("livekit.plugins.kyutai").setLevel(logging.INFO)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
