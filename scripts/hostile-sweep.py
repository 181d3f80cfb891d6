#!/usr/bin/env python3
"""Hostile-input sweep of the release binary over the bundled tiny models (issue #41).

Runs several hundred cases of the issue's classes against `moshi-rs` and classifies each one
automatically:

- clean: a refusal (nonzero exit, an `error:` line naming the cause), or a run interrupted by
  the signal the case sent, with nothing changed and nothing left behind;
- sane: an accepted run whose outputs check;
- defect: a panic (exit 101, "panicked", a backtrace), death by a signal the case did not send,
  a timeout (hang), an input or untouched file changed, a file left behind (a partial), peak
  resident memory above the case's cap, a raw control character in stdout or stderr, a refusal
  that does not name its cause, an accepted case that had to be refused (or the reverse), a
  server that dies, stops answering or grows past its cap under a hostile client.

Python 3 standard library only. Usage (docs/robustness.md):

    cargo build --release -p moshi-cli
    scripts/hostile-sweep.py [--bin target/release/moshi-rs] [--only CLASS,...] [--seed N] [-v]

Exit status 1 when a defect was found. Every case runs in its own empty folder under a
temporary work folder holding copies of the models and inputs; the models are restored after a
case that changed them.
"""

import argparse
import hashlib
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"a": "tiny-a", "hibiki": "tiny-hibiki", "stt": "tiny-stt", "tts": "tiny-tts"}
# Raw control characters a terminal acts on: C0 but tab and line feed, DEL, C1, bidi controls.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u202a-\u202e\u2066-\u2069]")
PARTIAL = re.compile(r"(\.partial|\.part)$")
DEFAULT_TIMEOUT_S = 20
DEFAULT_MEM_CAP_MIB = 400


class Result:
    def __init__(self):
        self.rc = None
        self.out = b""
        self.err = b""
        self.maxrss_mib = 0.0
        self.timed_out = False


class Case:
    """One hostile run: argv (the binary's arguments) and what it may do."""

    def __init__(self, klass, name, argv, expect="any", names=(), stdout="pipe", stdin=None,
                 may_write=(), timeout_s=DEFAULT_TIMEOUT_S, mem_cap_mib=DEFAULT_MEM_CAP_MIB,
                 setup=None, check=None, send_signal=None, binary_stdout=False, fsize=None):
        self.klass, self.name, self.argv = klass, name, argv
        self.expect = expect  # "error", "accept" or "any"
        self.names = names  # a refusal must mention one of these (case-insensitive)
        self.stdout = stdout  # pipe, closed, full, head, file
        self.stdin = stdin
        self.may_write = may_write  # names (in the case folder) the run may create or change
        self.timeout_s, self.mem_cap_mib = timeout_s, mem_cap_mib
        self.setup, self.check = setup, check
        self.send_signal = send_signal  # (signal number, delay in seconds)
        self.binary_stdout = binary_stdout
        self.fsize = fsize  # RLIMIT_FSIZE in bytes: a full disk


def run_binary(binary, case, cwd):
    r = Result()
    stdout_target, reader = subprocess.PIPE, None
    if case.stdout == "full":
        stdout_target = open("/dev/full", "wb")
    elif case.stdout == "file":
        stdout_target = open(os.path.join(cwd, "stdout.txt"), "wb")
    elif case.stdout in ("closed", "head"):
        read_fd, write_fd = os.pipe()
        stdout_target = write_fd
        reader = read_fd

    def limits():
        # Address space as a backstop for a runaway allocation (the cap checked is the RSS).
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))
        if case.fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (case.fsize, case.fsize))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    env = dict(os.environ, RUST_BACKTRACE="1", RAYON_NUM_THREADS="1", NO_COLOR="1")
    stdin = subprocess.DEVNULL if case.stdin is None else subprocess.PIPE
    p = subprocess.Popen([binary] + case.argv, cwd=cwd, stdin=stdin, stdout=stdout_target,
                         stderr=subprocess.PIPE, env=env, preexec_fn=limits)
    if case.stdout in ("closed", "head"):
        os.close(write_fd)
        if case.stdout == "closed":
            os.close(reader)
    chunks = {"out": [], "err": []}

    def pump(f, key):
        while True:
            b = f.read(65536)
            if not b:
                break
            if sum(len(c) for c in chunks[key]) < (4 << 20):
                chunks[key].append(b)

    threads = [threading.Thread(target=pump, args=(p.stderr, "err"), daemon=True)]
    if stdout_target is subprocess.PIPE:
        threads.append(threading.Thread(target=pump, args=(p.stdout, "out"), daemon=True))
    for t in threads:
        t.start()
    if case.stdin is not None:
        def feed():
            try:
                p.stdin.write(case.stdin)
                p.stdin.close()
            except OSError:
                pass
        threading.Thread(target=feed, daemon=True).start()
    if case.stdout == "head":
        os.read(reader, 1)
        os.close(reader)
    if case.send_signal:
        sig, delay = case.send_signal
        time.sleep(delay)
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.time() + case.timeout_s
    status = None
    while time.time() < deadline:
        pid, st, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            status = st
            r.maxrss_mib = ru.ru_maxrss / 1024
            break
        time.sleep(0.02)
    if status is None:
        r.timed_out = True
        p.kill()
        _, status, ru = os.wait4(p.pid, 0)
        r.maxrss_mib = ru.ru_maxrss / 1024
    p.returncode = os.waitstatus_to_exitcode(status)
    r.rc = p.returncode
    for t in threads:
        t.join(5)
    if isinstance(stdout_target, type(sys.stdout.buffer)) or hasattr(stdout_target, "close"):
        try:
            stdout_target.close()
        except Exception:
            pass
    r.out, r.err = b"".join(chunks["out"]), b"".join(chunks["err"])
    return r


def snapshot(root):
    snap = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            snap[os.path.relpath(p, root)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    return snap


def classify(case, r, before, after, case_dir, work):
    """(verdict, reasons): verdict clean, sane or defect."""
    reasons = []
    err = r.err.decode("utf-8", "replace")
    out = r.out.decode("utf-8", "replace")
    sig = case.send_signal[0] if case.send_signal else None
    if r.timed_out:
        reasons.append(f"timeout after {case.timeout_s} s")
    if r.rc == 101 or "panicked" in err or "stack backtrace" in err:
        reasons.append("panic: " + first_line(err, "panicked"))
    if r.rc is not None and r.rc < 0 and -r.rc != sig and not r.timed_out:
        reasons.append(f"killed by signal {-r.rc}")
    if r.maxrss_mib > case.mem_cap_mib:
        reasons.append(f"peak RSS {r.maxrss_mib:.0f} MiB above {case.mem_cap_mib} MiB")
    if CONTROL.search(err):
        reasons.append("raw control character in stderr: " + repr(CONTROL.search(err).group()))
    if not case.binary_stdout and CONTROL.search(out):
        reasons.append("raw control character in stdout: " + repr(CONTROL.search(out).group()))
    for path, st in before.items():
        if path.startswith("case") and os.path.basename(path) in case.may_write:
            continue
        if after.get(path) != st:
            reasons.append(f"changed or removed: {path}")
    for path in after:
        if path in before:
            continue
        base = os.path.basename(path)
        if PARTIAL.search(base) or base.startswith(".moshi-rs-"):
            reasons.append(f"left behind: {path}")
        elif path.startswith("case") and base not in case.may_write and base != "stdout.txt":
            reasons.append(f"unexpected file: {path}")
        elif not path.startswith("case"):
            reasons.append(f"file created outside the case folder: {path}")
    interrupted = sig is not None and r.rc == -sig
    if r.rc == 0:
        if case.expect == "error":
            reasons.append("accepted, should be refused")
    elif r.rc is not None and r.rc > 0 and not r.timed_out:
        if case.expect == "accept":
            reasons.append("refused: " + first_line(err, "error"))
        elif "error" not in err.lower():
            reasons.append(f"exit {r.rc} without an error message")
        elif case.names and not any(n.lower() in err.lower() for n in case.names):
            reasons.append(f"message does not name {case.names}: " + first_line(err, "error"))
    if case.check and not reasons:
        extra = case.check(r, case_dir, work)
        if extra:
            reasons.append(extra)
    if reasons:
        return "defect", reasons
    if r.rc == 0:
        return "sane", []
    if interrupted or (r.rc is not None and r.rc > 0):
        return "clean", []
    return "defect", [f"unexpected status {r.rc}"]


def first_line(text, key):
    for line in text.splitlines():
        if key in line.lower():
            return line.strip()[:200]
    return text.strip().splitlines()[0][:200] if text.strip() else "(nothing on stderr)"


# ---------------------------------------------------------------------------------------------
# Inputs


def wav_bytes(seconds, rate=24000, channels=1, bits=16, seed=1, fmt_tag=1, extra_chunks=b""):
    rnd = random.Random(seed)
    n = int(seconds * rate)
    width = bits // 8
    if bits == 16:
        data = b"".join(struct.pack("<h", int(8000 * ((i * 0.0523) % 2 - 1)) + rnd.randint(-500, 500))
                        for i in range(n * channels))
    else:
        data = bytes(rnd.getrandbits(8) for _ in range(n * channels * width))
    fmt = struct.pack("<HHIIHH", fmt_tag, channels, rate, rate * channels * width, channels * width, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra_chunks
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def riff(chunks, riff_size=None, form=b"WAVE"):
    body = form + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body) if riff_size is None else riff_size) + body


def chunk(cid, payload, size=None):
    pad = b"\0" if len(payload) % 2 else b""
    return cid + struct.pack("<I", len(payload) if size is None else size) + payload + pad


def fmt_payload(tag=1, ch=1, rate=24000, bits=16, align=None, byterate=None):
    align = ch * (bits // 8) if align is None else align
    byterate = rate * align if byterate is None else byterate
    return struct.pack("<HHIIHH", tag, ch, rate, byterate & 0xFFFFFFFF, align & 0xFFFF, bits)


def hostile_wavs():
    pcm = struct.pack("<480h", *range(480))
    ok_fmt = chunk(b"fmt ", fmt_payload())
    w = {
        "empty": b"",
        "riff-only": b"RIFF",
        "not-wave": riff([ok_fmt, chunk(b"data", pcm)], form=b"AVI "),
        "no-data": riff([ok_fmt]),
        "no-fmt": riff([chunk(b"data", pcm)]),
        "data-before-fmt": riff([chunk(b"data", pcm), ok_fmt]),
        "two-fmt": riff([ok_fmt, ok_fmt, chunk(b"data", pcm)]),
        "fmt-short": riff([chunk(b"fmt ", fmt_payload()[:10]), chunk(b"data", pcm)]),
        "fmt-huge-size": riff([chunk(b"fmt ", fmt_payload(), size=0xFFFFFFF0), chunk(b"data", pcm)]),
        "list-huge-size": riff([chunk(b"LIST", b"INFOabcd", size=0xFFFFFFFF), ok_fmt, chunk(b"data", pcm)]),
        "junk-odd": riff([chunk(b"JUNK", b"abc"), ok_fmt, chunk(b"data", pcm)]),
        "channels-0": riff([chunk(b"fmt ", fmt_payload(ch=0, align=2)), chunk(b"data", pcm)]),
        "channels-65535": riff([chunk(b"fmt ", fmt_payload(ch=65535)), chunk(b"data", pcm)]),
        "rate-0": riff([chunk(b"fmt ", fmt_payload(rate=0)), chunk(b"data", pcm)]),
        "rate-1": riff([chunk(b"fmt ", fmt_payload(rate=1)), chunk(b"data", pcm)]),
        "rate-4g": riff([chunk(b"fmt ", fmt_payload(rate=0xFFFFFFFF)), chunk(b"data", pcm)]),
        "bits-0": riff([chunk(b"fmt ", fmt_payload(bits=0, align=2)), chunk(b"data", pcm)]),
        "bits-7": riff([chunk(b"fmt ", fmt_payload(bits=7, align=1)), chunk(b"data", pcm)]),
        "bits-128": riff([chunk(b"fmt ", fmt_payload(bits=128)), chunk(b"data", pcm)]),
        "align-0": riff([chunk(b"fmt ", fmt_payload(align=0)), chunk(b"data", pcm)]),
        "align-mismatch": riff([chunk(b"fmt ", fmt_payload(align=7)), chunk(b"data", pcm)]),
        "float-16bit": riff([chunk(b"fmt ", fmt_payload(tag=3)), chunk(b"data", pcm)]),
        "alaw": riff([chunk(b"fmt ", fmt_payload(tag=6, bits=8)), chunk(b"data", pcm)]),
        "adpcm": riff([chunk(b"fmt ", fmt_payload(tag=2, bits=4, align=256)), chunk(b"data", pcm)]),
        "extensible-short": riff([chunk(b"fmt ", fmt_payload(tag=0xFFFE) + b"\x16\x00"), chunk(b"data", pcm)]),
        "extensible-cb-huge": riff([chunk(b"fmt ", fmt_payload(tag=0xFFFE) + b"\xff\xff" + b"\0" * 22), chunk(b"data", pcm)]),
        "extensible-bad-guid": riff([chunk(b"fmt ", fmt_payload(tag=0xFFFE) + struct.pack("<HHI", 22, 16, 4) + b"\x1b[31m" + b"\0" * 11), chunk(b"data", pcm)]),
        "data-size-past-end": riff([ok_fmt, chunk(b"data", pcm, size=10_000_000)]),
        "data-size-max": riff([ok_fmt, chunk(b"data", pcm, size=0xFFFFFFFF)]),
        "data-odd": riff([ok_fmt, chunk(b"data", pcm + b"\x01")]),
        "riff-size-0": riff([ok_fmt, chunk(b"data", pcm)], riff_size=0),
        "riff-size-small": riff([ok_fmt, chunk(b"data", pcm)], riff_size=12),
        "chunk-id-controls": riff([chunk(b"\x1b[2J", b"ab"), ok_fmt, chunk(b"data", pcm)]),
        "truncated-chunk-header": riff([ok_fmt]) + b"da",
        "rf64": b"RF64" + riff([ok_fmt, chunk(b"data", pcm)])[4:],
        "rifx": b"RIFX" + riff([ok_fmt, chunk(b"data", pcm)])[4:],
        "mp3-bytes": b"ID3\x04\0\0\0\0\0\0" + bytes(range(256)) * 4,
        "text": b"hello, I am not a wav\n",
        "zero-samples": riff([ok_fmt, chunk(b"data", b"")]),
        "one-sample": riff([ok_fmt, chunk(b"data", b"\x01\x00")]),
        "float-nan": riff([chunk(b"fmt ", fmt_payload(tag=3, bits=32)), chunk(b"data", struct.pack("<4f", float("nan"), float("inf"), -float("inf"), 1e30) * 960)]),
    }
    return w


def safetensors_bytes(header, data=b"", length=None):
    h = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def hostile_safetensors():
    ok = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    s = {
        "empty": b"",
        "seven-bytes": b"\x01\x02\x03\x04\x05\x06\x07",
        "len-max": safetensors_bytes(ok, b"\0" * 16, length=0xFFFFFFFFFFFFFFFF),
        "len-past-file": safetensors_bytes(ok, b"\0" * 16, length=1 << 20),
        "len-over-100mib": safetensors_bytes(ok, b"\0" * 16, length=200 << 20),
        "len-zero": safetensors_bytes(ok, b"", length=0),
        "header-not-json": safetensors_bytes(b"{this is not json" + b" " * 20),
        "header-array": safetensors_bytes([1, 2, 3]),
        "header-deep": safetensors_bytes(b"[" * 100000 + b"]" * 100000),
        "header-invalid-utf8": safetensors_bytes(b'{"\xff\xfe": 1}'),
        "dtype-unknown": safetensors_bytes({"w": {"dtype": "Q9_K", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
        "dtype-controls": safetensors_bytes({"w": {"dtype": "F\u001b[31m32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
        "name-controls": safetensors_bytes({"w\u001b]0;pwned\u0007\u202e": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
        "shape-huge": safetensors_bytes({"w": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 16]}}, b"\0" * 16),
        "shape-overflow": safetensors_bytes({"w": {"dtype": "F32", "shape": [18446744073709551615, 2], "data_offsets": [0, 16]}}, b"\0" * 16),
        "shape-negative": safetensors_bytes({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
        "shape-deep": safetensors_bytes({"w": {"dtype": "F32", "shape": [1] * 1000, "data_offsets": [0, 4]}}, b"\0" * 4),
        "offsets-past-end": safetensors_bytes({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 1 << 40]}}, b"\0" * 16),
        "offsets-reversed": safetensors_bytes({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 0]}}, b"\0" * 16),
        "offsets-overlap": safetensors_bytes({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, b"\0" * 24),
        "offsets-mismatch-shape": safetensors_bytes({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, b"\0" * 16),
        "metadata-huge-string": safetensors_bytes({"__metadata__": {"k": "x" * 2_000_000}, **ok}, b"\0" * 16),
        "metadata-not-strings": safetensors_bytes({"__metadata__": {"k": [1, 2]}, **ok}, b"\0" * 16),
        "many-empty-tensors": safetensors_bytes(b"{" + b",".join(b'"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i for i in range(200000)) + b"}"),
        "duplicate-names": safetensors_bytes(b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
        "gguf-magic": b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 1 << 60) + b"\0" * 64,
        "nan-weights-ok-header": safetensors_bytes(ok, struct.pack("<4f", float("nan"), 1, 2, 3)),
    }
    return s


def npy_bytes(descr, shape, data=b"", fortran=False, raw_header=None, magic=b"\x93NUMPY", version=(1, 0)):
    if raw_header is None:
        raw_header = ("{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)).encode()
    pad = 64 - (10 + len(raw_header) + 1) % 64
    h = raw_header + b" " * (pad % 64) + b"\n"
    if version[0] == 1:
        return magic + bytes(version) + struct.pack("<H", len(h)) + h + data
    return magic + bytes(version) + struct.pack("<I", len(h)) + h + data


def hostile_npys():
    codes = struct.pack("<16q", *([3] * 16))
    return {
        "empty": b"",
        "bad-magic": b"\x93NUMPZ\x01\x00" + b"\0" * 60,
        "header-len-huge-v2": b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFFF) + b"{",
        "header-len-past-file": b"\x93NUMPY\x01\x00" + struct.pack("<H", 60000) + b"{'descr'",
        "version-9": npy_bytes("'<i8'", "(8, 2)", codes, version=(9, 0)),
        "dtype-nul": npy_bytes("'<i8\\x00'", "(8, 2)", codes),
        "dtype-escape": npy_bytes("'<i8\x1b[31m'", "(8, 2)", codes),
        "dtype-object": npy_bytes("'|O'", "(8, 2)", codes),
        "dtype-big-endian": npy_bytes("'>i8'", "(8, 2)", codes),
        "dtype-u1": npy_bytes("'|u1'", "(8, 2)", bytes(16)),
        "dtype-struct": npy_bytes("[('a', '<i8')]", "(8, 2)", codes),
        "fortran": npy_bytes("'<i8'", "(8, 2)", codes, fortran=True),
        "shape-huge": npy_bytes("'<i8'", "(1000000000, 1000000000)", codes),
        "shape-overflow": npy_bytes("'<i8'", "(18446744073709551615, 18446744073709551615)", codes),
        "shape-negative": npy_bytes("'<i8'", "(-8, 2)", codes),
        "shape-3d": npy_bytes("'<i8'", "(2, 2, 4)", codes),
        "shape-0d": npy_bytes("'<i8'", "()", codes[:8]),
        "data-short": npy_bytes("'<i8'", "(8, 200)", codes),
        "data-long": npy_bytes("'<i8'", "(8, 2)", codes * 3),
        "codes-out-of-range": npy_bytes("'<i8'", "(8, 2)", struct.pack("<16q", *([1 << 40] * 16))),
        "codes-negative": npy_bytes("'<i8'", "(8, 2)", struct.pack("<16q", *([-5] * 16))),
        "header-not-dict": npy_bytes(None, None, codes, raw_header=b"[1, 2, 3]"),
        "header-deep": npy_bytes(None, None, codes, raw_header=b"{'descr': " + b"(" * 5000 + b")" * 5000 + b"}"),
        "header-unterminated": npy_bytes(None, None, codes, raw_header=b"{'descr': '<i8', 'shape': (8, 2"),
        "header-invalid-utf8": npy_bytes(None, None, codes, raw_header=b"{'descr': '<i8\xff', 'fortran_order': False, 'shape': (8, 2), }"),
        "zero-frames": npy_bytes("'<i8'", "(8, 0)", b""),
        "codebooks-0": npy_bytes("'<i8'", "(0, 5)", b""),
        "codebooks-1000": npy_bytes("'<i8'", "(1000, 1)", struct.pack("<1000q", *([1] * 1000))),
    }


def config_variants(base):
    def edited(**kv):
        c = dict(base)
        c.update(kv)
        return json.dumps(c).encode()
    return {
        "empty": b"",
        "not-json": b"{nope",
        "array": b"[]",
        "bom": b"\xef\xbb\xbf" + json.dumps(base).encode(),
        "invalid-utf8": b'{"dim": 1\xff}',
        "deep": b"[" * 200000 + b"]" * 200000,
        "two-mib": b'{"pad": "' + b"x" * (2 << 20) + b'"}',
        "dim-huge": edited(dim=1 << 40),
        "dim-negative": edited(dim=-4),
        "dim-float": edited(dim=1.5),
        "dim-string": edited(dim="256"),
        "num-heads-0": edited(num_heads=0),
        "context-huge": edited(context=1 << 50),
        "num-layers-huge": edited(num_layers=1_000_000),
        "delays-wrong-length": edited(delays=[0, 1]),
        "card-0": edited(card=0),
        "text-card-huge": edited(text_card=1 << 40),
        "nan-literal": json.dumps(base)[:-1].encode() + b', "x": NaN}',
        "number-1e999": edited(dim=None)[:-1] + b', "hidden_scale": 1e999}',
        "key-controls": edited(**{"\u001b[2J\u202e": 1}),
        "moshi-name-passwd": edited(moshi_name="/etc/passwd"),
        "moshi-name-dot": edited(moshi_name="."),
        "moshi-name-controls": edited(moshi_name="a\u001b[31m.safetensors"),
        "moshi-name-traversal": edited(moshi_name="../../../../etc/hostname"),
        "mimi-name-dev-zero": edited(mimi_name="/dev/zero"),
        "tokenizer-name-dir": edited(tokenizer_name="."),
        "cfg-coef-negative": edited(lm_gen_config={"cfg_coef": -1e300}),
        "temp-nan-string": edited(lm_gen_config={"temp": "NaN"}),
        "gating-unknown": edited(gating="\u001b]0;x\u0007"),
        "duplicate-key": b'{"dim": 1, "dim": 2}',
    }


def mimi_config_variants(base):
    def edited(**kv):
        c = json.loads(json.dumps(base))
        c.update(kv)
        return json.dumps(c).encode()
    return {
        "empty": b"",
        "sample-rate-0": edited(sample_rate=0),
        "frame-rate-huge": edited(frame_rate=1e300),
        "channels-0": edited(channels=0),
        "deep": b"{" + b'"a":{' * 100000 + b"}" * 100001,
        "unknown-activation": edited(seanet={"activation": "\u001b[2J"}),
    }


# ---------------------------------------------------------------------------------------------
# The cases


class Env:
    """The work folder: model copies (models/NAME), inputs (inputs/), hostile files (bad/)."""

    def __init__(self, binary, work):
        self.binary, self.work = binary, work
        self.models = os.path.join(work, "models")
        os.makedirs(self.models)
        for short, name in MODELS.items():
            shutil.copytree(os.path.join(ROOT, "assets", name), os.path.join(self.models, short),
                            ignore=shutil.ignore_patterns("ref", "MANIFEST.md"))
        self.inputs = os.path.join(work, "inputs")
        self.bad = os.path.join(work, "bad")
        os.makedirs(self.inputs)
        os.makedirs(self.bad)
        self.wav = self.put(self.inputs, "in.wav", wav_bytes(1.2))
        # Long enough that a signal within 2.5 s finds most runs at work: 1 s repeated.
        second = wav_bytes(1.0, rate=16000, seed=2)
        pcm = second[44:] * 300
        self.long_wav = self.put(self.inputs, "long.wav", second[:4] + struct.pack("<I", 36 + len(pcm))
                                 + second[8:40] + struct.pack("<I", len(pcm)) + pcm)
        self.text = self.put(self.inputs, "text.txt", b"Hello there, how are you today?\n")
        self.long_text = self.put(self.inputs, "long.txt", b"one two three four five six seven. " * 600 + b"\n")
        self.codes = os.path.join(self.inputs, "codes.npy")
        subprocess.run([binary, "codec", "encode", "--model", self.m("a"), self.wav, self.codes],
                       check=True, capture_output=True)
        self.long_codes = os.path.join(self.inputs, "long-codes.npy")
        subprocess.run([binary, "codec", "encode", "--model", self.m("a"), self.long_wav, self.long_codes],
                       check=True, capture_output=True)
        voices = os.path.join(self.m("tts"), "voices")
        self.voice = next(os.path.join(d, f) for d, _, fs in os.walk(voices) for f in sorted(fs)
                          if f.endswith(".safetensors"))
        self.pristine = os.path.join(os.path.dirname(work), os.path.basename(work) + "-pristine")
        shutil.copytree(self.models, self.pristine)

    def m(self, short, name=None):
        return os.path.join(self.models, short) if name is None else os.path.join(self.models, short, name)

    @staticmethod
    def put(folder, name, data):
        p = os.path.join(folder, name)
        with open(p, "wb") as f:
            f.write(data)
        return p

    def restore(self):
        shutil.rmtree(self.models)
        shutil.copytree(self.pristine, self.models)


def model_files(env, short):
    """The files of a model folder a run reads (not the sample inputs or the other formats)."""
    return [env.m(short, f) for f in sorted(os.listdir(env.m(short)))
            if os.path.isfile(env.m(short, f)) and not f.startswith("input") and ".q" not in f]


# Commands that write: (name, argv builder(outputs dict) -> argv, output flags, inputs, model).
def writing_commands(env):
    a, stt, tts, hib = env.m("a"), env.m("stt"), env.m("tts"), env.m("hibiki")

    def file_argv(o):
        argv = ["file", "--model", a, "--greedy", env.wav, o.get("OUT", "out.wav")]
        for flag in ("--transcript", "--tokens-out", "--profile"):
            if flag in o:
                argv += [flag, o[flag]]
        return argv

    def hibiki_argv(o):
        argv = ["file", "--model", hib, "--greedy", "--max-tail-s", "1", env.wav, o.get("OUT", "out.wav")]
        for flag in ("--transcript", "--tokens-out"):
            if flag in o:
                argv += [flag, o[flag]]
        return argv

    def transcribe_argv(o):
        argv = ["transcribe", "--model", stt, env.wav]
        for flag in ("--out", "--tokens-out", "--profile"):
            if flag in o:
                argv += [flag, o[flag]]
        return argv

    def encode_argv(o):
        return ["codec", "encode", "--model", a, env.wav, o.get("OUT", "out.npy")]

    def decode_argv(o):
        return ["codec", "decode", "--model", a, env.codes, o.get("OUT", "out.wav")]

    def quantize_argv(o):
        return ["quantize", "--bits", "8", env.m("a", "model.safetensors"), o.get("OUT", "q.safetensors")]

    def bench_argv(o):
        argv = ["bench", "--model", a, "--frames", "2", "--warmup", "0", "--bandwidth-buffer-mib", "16"]
        for flag in ("--json", "--trace"):
            if flag in o:
                argv += [flag, o[flag]]
        return argv

    def speak_argv(o):
        argv = ["speak", "--model", tts, "--greedy", "--voice", env.voice, "--text-file", env.text,
                o.get("OUT", "out.wav")]
        for flag in ("--tokens-out", "--words"):
            if flag in o:
                argv += [flag, o[flag]]
        return argv

    def chat_argv(o):
        argv = ["chat", "--model", a, "--duration-s", "1"]
        for flag in ("--record", "--record-raw-mic", "--profile", "--stats-json"):
            if flag in o:
                argv += [flag, o[flag]]
        return argv

    return [
        ("file", file_argv, ["OUT", "--transcript", "--tokens-out", "--profile"], model_files(env, "a") + [env.wav]),
        ("file-hibiki", hibiki_argv, ["OUT", "--transcript", "--tokens-out"], model_files(env, "hibiki") + [env.wav]),
        ("transcribe", transcribe_argv, ["--out", "--tokens-out", "--profile"], model_files(env, "stt") + [env.wav]),
        ("codec-encode", encode_argv, ["OUT"], [env.m("a", "mimi.safetensors"), env.m("a", "mimi_config.json"), env.wav]),
        ("codec-decode", decode_argv, ["OUT"], [env.m("a", "mimi.safetensors"), env.m("a", "mimi_config.json"), env.codes]),
        ("quantize", quantize_argv, ["OUT"], [env.m("a", "model.safetensors"), env.m("a", "config.json")]),
        ("bench", bench_argv, ["--json", "--trace"], model_files(env, "a")),
        ("speak", speak_argv, ["OUT", "--tokens-out", "--words"], model_files(env, "tts") + [env.voice, env.text]),
        ("chat", chat_argv, ["--record", "--record-raw-mic", "--profile", "--stats-json"], model_files(env, "a")),
    ]


def output_cases(env):
    cases = []
    for cmd, argv_of, outs, inputs in writing_commands(env):
        klass = "outputs"
        # Every output against every input, spelled four ways.
        for out in outs:
            for inp in inputs:
                base = os.path.basename(inp)
                rel = os.path.relpath(inp, start=os.path.join(env.work, "caseX"))
                for how in ("same", "relative", "symlink", "hardlink", "dotdot"):
                    def setup(case_dir, inp=inp, how=how):
                        if how == "symlink":
                            os.symlink(inp, os.path.join(case_dir, "alias"))
                        elif how == "hardlink":
                            os.link(inp, os.path.join(case_dir, "alias"))
                    path = {"same": inp, "relative": rel, "symlink": "alias", "hardlink": "alias",
                            "dotdot": os.path.join(os.path.dirname(inp), "..", os.path.basename(os.path.dirname(inp)), base)}[how]
                    cases.append(Case(klass, f"{cmd} {out}=input {base} ({how})", argv_of({out: path}),
                                      expect="error", names=(out if out != "OUT" else "output", "input", base),
                                      setup=setup, may_write=()))
        # Every output against every other output.
        for i, o1 in enumerate(outs):
            for o2 in outs[i + 1:]:
                for how in ("same", "symlink", "hardlink"):
                    def setup(case_dir, how=how):
                        open(os.path.join(case_dir, "x.out"), "wb").write(b"old\n")
                        if how == "symlink":
                            os.symlink("x.out", os.path.join(case_dir, "y.out"))
                        elif how == "hardlink":
                            os.link(os.path.join(case_dir, "x.out"), os.path.join(case_dir, "y.out"))
                    other = "x.out" if how == "same" else "y.out"
                    cases.append(Case(klass, f"{cmd} {o1} and {o2} one file ({how})",
                                      argv_of({o1: "x.out", o2: other}), expect="error",
                                      names=(o1 if o1 != "OUT" else "output", o2, "x.out", "y.out"), setup=setup))
        # Special destinations for each output.
        for out in outs:
            # The extension some outputs need (else that is the error, before the name's length).
            ext = {"codec-decode": ".wav", "codec-encode": ".npy"}.get(cmd, ".tsv" if out == "--out" else ".out")

            def pre(case_dir, kind):
                if kind == "dir":
                    os.mkdir(os.path.join(case_dir, "d"))
                elif kind == "readonly":
                    p = os.path.join(case_dir, "ro.out")
                    open(p, "wb").write(b"old")
                    os.chmod(p, 0o444)
                elif kind == "dangling":
                    os.symlink("target.out", os.path.join(case_dir, "dangling.out"))
                elif kind == "fifo":
                    os.mkfifo(os.path.join(case_dir, "f.out"))
            specials = [
                ("dir", "d", "error", ()),
                ("dir-slash", "new/", "error", ()),
                ("missing-folder", "nope/x.out", "error", ("nope", "folder", "directory")),
                ("readonly", "ro.out", "error", ("ro.out", "permission", "read-only")),
                ("dev-full", "/dev/full", "error", ("space", "/dev/full", "extension")),
                ("dev-null", "/dev/null", "any", ()),
                ("dangling", "dangling.out", "any", ("dangling", "target")),
                ("name-255", "n" * (255 - len(ext)) + ext, "any", ()),
                ("name-256", "n" * (256 - len(ext)) + ext, "error", ("long",)),
                ("dev-stdout", "/dev/stdout", "any", ()),
                ("proc-fd-1", "/proc/self/fd/1", "any", ()),
                ("empty-name", "", "error", ()),
            ]
            for kind, path, expect, names in specials:
                if cmd == "chat" and expect == "any":
                    expect = "error"  # no audio device here: chat must say so
                    names = ("device",)
                elif cmd == "chat" and names:
                    names = names + ("device",)
                cases.append(Case(klass, f"{cmd} {out}={kind}", argv_of({out: path}), expect=expect,
                                  names=names, setup=lambda d, k=kind: pre(d, k), binary_stdout=True,
                                  may_write=("target.out", "n" * (255 - len(ext)) + ext, "x.out", "out.wav", "out.npy", "q.safetensors"),
                                  timeout_s=60))
    return cases


def committed_together_cases(env):
    """A failed run (one output on /dev/full, or a full disk) replaces no output."""
    cases = []
    for cmd, argv_of, outs, inputs in writing_commands(env):
        if len(outs) < 2 or cmd == "chat":
            continue
        for bad in outs:
            o = {x: f"{x.strip('-')}.tsv" for x in outs if x != bad}
            o[bad] = "/dev/full"

            def setup(case_dir, o=o):
                for p in o.values():
                    if not p.startswith("/"):
                        open(os.path.join(case_dir, p), "wb").write(b"old output\n")

            def check(r, case_dir, work, o=o):
                for p in o.values():
                    if not p.startswith("/") and open(os.path.join(case_dir, p), "rb").read() != b"old output\n":
                        return f"{p} replaced by a failed run"
            cases.append(Case("outputs", f"{cmd} {bad}=/dev/full keeps the others", argv_of(o),
                              expect="error", names=("space", "extension"), setup=setup, check=check,
                              may_write=tuple(o.values()), timeout_s=60))
        # A full disk: files may not grow past 4 KiB.
        o = {x: f"{x.strip('-')}.tsv" for x in outs}
        cases.append(Case("outputs", f"{cmd} full disk (RLIMIT_FSIZE 4 KiB)", argv_of(o), expect="any",
                          fsize=4096, may_write=tuple(o.values()), timeout_s=60))
    return cases


def signal_cases(env, rnd):
    a, stt, tts, hib = env.m("a"), env.m("stt"), env.m("tts"), env.m("hibiki")
    runs = [
        ("file", ["file", "--model", a, env.long_wav, "out.wav", "--transcript", "t.tsv", "--tokens-out", "k.jsonl", "--profile", "p.jsonl"]),
        ("file-hibiki", ["file", "--model", hib, env.long_wav, "out.wav", "--transcript", "t.tsv", "--tokens-out", "k.jsonl"]),
        ("transcribe", ["transcribe", "--model", stt, env.long_wav, "--out", "t.tsv", "--tokens-out", "k.jsonl", "--profile", "p.jsonl"]),
        ("codec-encode", ["codec", "encode", "--model", a, env.long_wav, "out.npy"]),
        ("codec-decode", ["codec", "decode", "--model", a, env.long_codes, "out.wav"]),
        ("quantize", ["quantize", "--bits", "4", env.m("a", "model.safetensors"), "out.safetensors"]),
        ("bench", ["bench", "--model", a, "--frames", "20000", "--bandwidth-buffer-mib", "16", "--json", "b.json", "--trace", "tr.json"]),
        ("speak", ["speak", "--model", tts, "--voice", env.voice, "--text-file", env.long_text, "out.wav", "--tokens-out", "k.jsonl", "--words", "w.tsv"]),
    ]
    names = ("out.wav", "t.tsv", "k.jsonl", "p.jsonl", "out.npy", "out.safetensors", "b.json", "tr.json", "w.tsv")
    cases = []
    for cmd, argv in runs:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            for k in range(4):
                delay = round(rnd.uniform(0.05, 3.0), 2)

                def setup(case_dir):
                    for n in names:
                        open(os.path.join(case_dir, n), "wb").write(b"old output\n")

                def check(r, case_dir, work, argv=argv):
                    olds = [n for n in names if open(os.path.join(case_dir, n), "rb").read() == b"old output\n"]
                    used = [n for n in names if n in argv]
                    if r.rc != 0 and len([n for n in used if n not in olds]) > 0:
                        return "interrupted run replaced " + ", ".join(n for n in used if n not in olds)
                    if r.rc == 0 and any(n in olds for n in used):
                        return "completed run left old outputs: " + ", ".join(n for n in used if n in olds)
                cases.append(Case("signals", f"{cmd} {signal.Signals(sig).name} after {delay} s", argv,
                                  expect="any", send_signal=(sig, delay), setup=setup, check=check,
                                  may_write=names, timeout_s=90))
    return cases


def stdout_cases(env):
    a, stt, tts = env.m("a"), env.m("stt"), env.m("tts")
    printing = [
        ("inspect folder", ["inspect", a]),
        ("inspect --json", ["inspect", "--json", a]),
        ("inspect weights", ["inspect", env.m("a", "model.safetensors")]),
        ("inspect q4", ["inspect", env.m("a", "model.q4.safetensors")]),
        ("inspect tokenizer", ["inspect", env.m("a", "tokenizer.model")]),
        ("inspect config", ["inspect", env.m("a", "config.json")]),
        ("inspect tts", ["inspect", tts]),
        ("inspect stt --json", ["inspect", "--json", stt]),
        ("devices", ["devices"]),
        ("file words", ["file", "--model", a, env.wav, "/dev/null"]),
        ("transcribe words", ["transcribe", "--model", stt, env.wav]),
        ("bench report", ["bench", "--model", a, "--frames", "2", "--warmup", "0", "--bandwidth-buffer-mib", "16"]),
        ("speak", ["speak", "--model", tts, "--voice", env.voice, "hello", "/dev/null"]),
        ("codec decode to stdout", ["codec", "decode", "--model", a, env.codes, "/dev/stdout"]),
        ("file wav to stdout", ["file", "--model", a, env.wav, "/dev/stdout"]),
        ("--help", ["--help"]),
        ("--version", ["--version"]),
        ("help file", ["help", "file"]),
        ("speak --help", ["speak", "--help"]),
    ]
    cases = []
    for name, argv in printing:
        binary = "stdout" in name
        for mode in ("pipe", "closed", "head", "full", "file"):
            # speak prints nothing on stdout: a full one is no error for it
            expect = "error" if mode == "full" and not name.startswith("speak") else "any"
            names = ("stdout", "space") if mode == "full" else ()
            if mode in ("closed", "head"):
                expect = "any"
            cases.append(Case("stdout", f"{name} > {mode}", argv, expect=expect, names=names,
                              stdout=mode, binary_stdout=binary, timeout_s=60))
    return cases


def reader_cases(env):
    """Untrusted sizes and formats in every file a command reads."""
    a, stt, tts = env.m("a"), env.m("stt"), env.m("tts")
    cases = []
    bad = env.bad

    def mk(name, data):
        return env.put(bad, name, data)

    specials = {"dev-zero": "/dev/zero", "dev-null": "/dev/null", "dir": bad, "missing": os.path.join(bad, "missing")}
    os.symlink("loop2", os.path.join(bad, "loop1"))
    os.symlink("loop1", os.path.join(bad, "loop2"))
    specials["symlink-loop"] = os.path.join(bad, "loop1")
    unreadable = mk("unreadable.bin", b"x")
    os.chmod(unreadable, 0)
    if os.geteuid() != 0:
        specials["unreadable"] = unreadable

    # WAV inputs: file, transcribe, codec encode.
    for name, data in list(hostile_wavs().items()) + [(k, None) for k in specials]:
        p = specials[name] if data is None else mk(f"wav-{name}.wav", data)
        for cmd, argv in (("file", ["file", "--model", a, p, "o.wav"]),
                          ("transcribe", ["transcribe", "--model", stt, p]),
                          ("codec encode", ["codec", "encode", "--model", a, p, "o.npy"])):
            cases.append(Case("readers", f"{cmd} wav {name}", argv, expect="any",
                              names=(os.path.basename(p), "wav", "riff", "input"), may_write=("o.wav", "o.npy"), timeout_s=30))
    # safetensors: inspect, file --weights, quantize, codec --mimi, speak --voice.
    for name, data in list(hostile_safetensors().items()) + [(k, None) for k in specials]:
        p = specials[name] if data is None else mk(f"st-{name}.safetensors", data)
        base = os.path.basename(p)
        for cmd, argv in (("inspect", ["inspect", p]),
                          ("file --weights", ["file", "--model", a, "--weights", p, env.wav, "o.wav"]),
                          ("quantize", ["quantize", "--bits", "4", "--config", env.m("a", "config.json"), p, "o.safetensors"]),
                          ("codec --mimi", ["codec", "encode", "--mimi", p, "--mimi-config", env.m("a", "mimi_config.json"), env.wav, "o.npy"]),
                          ("speak --voice", ["speak", "--model", tts, "--voice", p, "hi", "o.wav"])):
            # inspect names what it cannot recognise; the others must refuse
            expect = "any" if (name == "nan-weights-ok-header" and cmd == "inspect") else "error"
            cases.append(Case("readers", f"{cmd} safetensors {name}", argv, expect=expect,
                              names=(base, "safetensors", "header", "tensor", "gguf", "--voice", "voice"),
                              may_write=("o.wav", "o.npy", "o.safetensors"), timeout_s=30))
    # npy: codec decode.
    for name, data in list(hostile_npys().items()) + [(k, None) for k in specials]:
        p = specials[name] if data is None else mk(f"npy-{name}.npy", data)
        expect = "any" if name in ("data-long", "zero-frames", "dtype-u1") else "error"
        cases.append(Case("readers", f"codec decode npy {name}", ["codec", "decode", "--model", a, p, "o.wav"],
                          expect=expect, names=(os.path.basename(p), "npy", "codes", "code"), may_write=("o.wav",), timeout_s=30))
    # Configs: file --config, inspect, a model folder holding it.
    base_cfg = json.load(open(env.m("a", "config.json")))
    for name, data in list(config_variants(base_cfg).items()) + [(k, None) for k in specials]:
        p = specials[name] if data is None else mk(f"cfg-{name}.json", data)
        expect = "any"
        cases.append(Case("readers", f"file --config {name}", ["file", "--model", a, "--config", p, env.wav, "o.wav"],
                          expect=expect, names=(os.path.basename(p), "config", "--config"), may_write=("o.wav",), timeout_s=30))
        if data is not None:
            def setup(case_dir, data=data):
                m = os.path.join(case_dir, "m")
                os.mkdir(m)
                for f in os.listdir(a):
                    if f != "config.json":
                        os.symlink(os.path.join(a, f), os.path.join(m, f))
                open(os.path.join(m, "config.json"), "wb").write(data)
            cases.append(Case("readers", f"inspect folder with config {name}", ["inspect", "m"], expect="any",
                              names=("config",), setup=setup, may_write=("config.json",) + tuple(os.listdir(a))))
            cases.append(Case("readers", f"bench folder with config {name}", ["bench", "--model", "m", "--frames", "1", "--warmup", "0", "--bandwidth-buffer-mib", "16"],
                              expect="any", names=("config",), setup=setup, may_write=("config.json",) + tuple(os.listdir(a))))
    base_mimi = json.load(open(env.m("a", "mimi_config.json")))
    for name, data in mimi_config_variants(base_mimi).items():
        p = mk(f"mimi-{name}.json", data)
        cases.append(Case("readers", f"codec --mimi-config {name}", ["codec", "encode", "--model", a, "--mimi-config", p, env.wav, "o.npy"],
                          expect="error", names=(os.path.basename(p), "mimi", "config"), may_write=("o.npy",)))
    # Tokenizers.
    real_tok = open(env.m("a", "tokenizer.model"), "rb").read()
    toks = {"empty": b"", "random": bytes(random.Random(5).getrandbits(8) for _ in range(4096)),
            "truncated": real_tok[: len(real_tok) // 3], "varint-huge": b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\x7f",
            "json-like": b'{"model": {"type": "BPE"}}'}
    for name, data in list(toks.items()) + [(k, None) for k in specials]:
        p = specials[name] if data is None else mk(f"tok-{name}.model", data)
        for cmd, argv in (("file --tokenizer", ["file", "--model", a, "--tokenizer", p, env.wav, "o.wav"]),
                          ("inspect tokenizer", ["inspect", p]),
                          ("transcribe --tokenizer", ["transcribe", "--model", stt, "--tokenizer", p, env.wav])):
            cases.append(Case("readers", f"{cmd} {name}", argv, expect="error",
                              names=(os.path.basename(p), "tokenizer", "sentencepiece"), may_write=("o.wav",)))
    # Text for speak.
    texts = {"invalid-utf8": b"hello \xff\xfe world\n", "controls": b"hi \x1b[31mred\x1b[0m \x07 there\n",
             "empty": b"", "nul": b"a\0b\n", "one-long-line": b"a" * (3 << 20), "bidi": "x \u202e y\n".encode()}
    for name, data in list(texts.items()) + [(k, None) for k in specials]:
        p = specials[name] if data is None else mk(f"text-{name}.txt", data)
        cases.append(Case("readers", f"speak --text-file {name}",
                          ["speak", "--model", tts, "--voice", env.voice, "--greedy", "--text-file", p, "o.wav", "--words", "w.tsv"],
                          expect="any", names=(os.path.basename(p), "text", "--text-file", "utf-8"), may_write=("o.wav", "w.tsv"), timeout_s=60))
    cases.append(Case("readers", "speak text on stdin invalid utf-8",
                      ["speak", "--model", tts, "--voice", env.voice, "--greedy", "-", "o.wav"],
                      stdin=b"hi \xff there\n\x1b[2J\n", expect="any", names=("utf-8", "stdin", "standard input"), may_write=("o.wav",), timeout_s=60))
    # Voice names.
    for name, voice in (("traversal", "../../../../etc/passwd"), ("controls", "ex\u001b[31m"),
                        ("absolute-dir", "/"), ("empty", ""), ("long", "v" * 5000)):
        cases.append(Case("readers", f"speak --voice {name}", ["speak", "--model", tts, "--voice", voice, "hi", "o.wav"],
                          expect="error", names=("voice",), may_write=("o.wav",)))
    # TLS PEM and API key files: serve refuses them before listening.
    pems = {"garbage": b"not a pem\n", "empty": b"", "begin-only": b"-----BEGIN CERTIFICATE-----\n",
            "bad-base64": b"-----BEGIN CERTIFICATE-----\n!!!\x1b[2J\n-----END CERTIFICATE-----\n",
            "five-mib": b"-----BEGIN CERTIFICATE-----\n" + b"QUFB\n" * (5 << 18) + b"-----END CERTIFICATE-----\n",
            "key-as-cert": b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n"}
    for name, data in list(pems.items()) + [(k, None) for k in specials]:
        p = specials[name] if data is None else mk(f"pem-{name}.pem", data)
        for flag, other in (("--tls-cert", "--tls-key"), ("--tls-key", "--tls-cert")):
            cases.append(Case("readers", f"serve {flag} {name}",
                              ["serve", "--model", a, "--port", "0", "--static", "none", flag, p, other, mk("other.pem", pems["garbage"])],
                              expect="error", names=(flag, os.path.basename(p), "pem", "tls"), timeout_s=30))
    keys = {"empty": b"", "controls": b"key\x1b[2J\n", "huge": b"k" * (20 << 20), "invalid-utf8": b"\xff\xfe\n"}
    for name, data in list(keys.items()) + [(k, None) for k in specials]:
        p = specials[name] if data is None else mk(f"keys-{name}.txt", data)
        cases.append(Case("readers", f"serve --api-key-file {name}",
                          ["serve", "--model", a, "--port", "0", "--static", "none", "--api-key-file", p],
                          expect="error", names=("--api-key-file", os.path.basename(p), "key"), timeout_s=30))
    # Pipes (a FIFO, as `<(...)` gives) with a writer that never stops: every reader must stop
    # at its cap, not read without end. (A FIFO with no writer makes any reader wait, as `cat`
    # does: that is the pipe's meaning, not a case.)
    endless = [
        ("file --config", ["file", "--model", a, "--config", "pipe.in", env.wav, "o.wav"], b"{" + b" " * 65535),
        ("file --tokenizer", ["file", "--model", a, "--tokenizer", "pipe.in", env.wav, "o.wav"], b"\x0a" * 65536),
        ("file wav input", ["file", "--model", a, "pipe.in", "o.wav"], b"RIFF" + b"\xff" * 65532),
        ("codec encode wav input", ["codec", "encode", "--model", a, "pipe.in", "o.npy"], bytes(range(256)) * 256),
        ("codec decode npy", ["codec", "decode", "--model", a, "pipe.in", "o.wav"], b"\x93NUMPY\x01\x00\xff\xff" + b"{" * 65526),
        ("inspect", ["inspect", "pipe.in"], b"\0" * 65536),
        ("serve --api-key-file", ["serve", "--model", a, "--port", "0", "--static", "none", "--api-key-file", "pipe.in"], b"k" * 65536),
        ("serve --tls-cert", ["serve", "--model", a, "--port", "0", "--static", "none", "--tls-cert", "pipe.in", "--tls-key", env.m("a", "config.json")], b"A" * 65536),
        ("speak --voice", ["speak", "--model", tts, "--voice", "pipe.in", "hi", "o.wav"], b"\0" * 65536),
        ("transcribe input", ["transcribe", "--model", stt, "pipe.in"], b"\0" * 65536),
    ]
    for name, argv, chunk_bytes in endless:
        def setup(case_dir, chunk_bytes=chunk_bytes):
            fifo = os.path.join(case_dir, "pipe.in")
            os.mkfifo(fifo)

            def write():
                end = time.time() + 40
                try:
                    fd = os.open(fifo, os.O_WRONLY)
                    while time.time() < end:
                        os.write(fd, chunk_bytes)
                except OSError:
                    pass
            threading.Thread(target=write, daemon=True).start()
        cases.append(Case("readers", f"{name} from an endless pipe", argv, expect="error", setup=setup,
                          names=("pipe.in", "large", "too", "pipe"), may_write=("pipe.in", "o.wav", "o.npy"), timeout_s=30))
    return cases


def flag_cases(env):
    a = env.m("a")
    cases = []
    flags = [
        (["file", "--model", a, "--temp", "NaN", env.wav, "o.wav"], "--temp"),
        (["file", "--model", a, "--temp", "-1", env.wav, "o.wav"], "--temp"),
        (["file", "--model", a, "--top-k", "99999999999999999999", env.wav, "o.wav"], "--top-k"),
        (["file", "--model", a, "--cfg-coef", "1e30", env.wav, "o.wav"], "--cfg-coef"),
        (["file", "--model", a, "--cfg-coef", "-3", env.wav, "o.wav"], "--cfg-coef"),
        (["file", "--model", a, "--max-tail-s", "1e12", env.wav, "o.wav"], "--max-tail-s"),
        (["file", "--model", a, "--max-tail-s", "-1", env.wav, "o.wav"], "--max-tail-s"),
        (["bench", "--model", a, "--frames", "99999999999"], "--frames"),
        (["bench", "--model", a, "--threads", "100000"], "--threads"),
        (["bench", "--model", a, "--sessions", "100000", "--frames", "1"], "--sessions"),
        (["bench", "--model", a, "--kv-prefill", "1000000000", "--frames", "1"], "--kv-prefill"),
        (["bench", "--random-weights", "--layers", "100000", "--frames", "1"], "--layers"),
        (["bench", "--model", a, "--bandwidth-buffer-mib", "0"], "--bandwidth-buffer-mib"),
        (["quantize", "--bits", "3", env.m("a", "model.safetensors"), "o.safetensors"], "--bits"),
        (["quantize", "--bits", "4", "--group-size", "7", env.m("a", "model.safetensors"), "o.safetensors"], "--group-size"),
        (["codec", "encode", "--model", a, "--codebooks", "100000", env.wav, "o.npy"], "codebooks"),
        (["codec", "encode", "--model", a, "--codebooks", "0", env.wav, "o.npy"], "codebooks"),
        (["serve", "--model", a, "--port", "70000"], "--port"),
        (["serve", "--model", a, "--host", "example.invalid"], "--host"),
        (["serve", "--model", a, "--max-sessions", "0"], "--max-sessions"),
        (["serve", "--model", a, "--max-sessions", "100000000"], "--max-sessions"),
        (["serve", "--model", a, "--idle-timeout-s", "NaN"], "--idle-timeout-s"),
        (["serve", "--model", a, "--static", "/etc/passwd"], "--static"),
        (["serve", "--model", a, "--record", env.wav], "--record"),
        (["serve", "--module", "/etc=" + a], "--module"),
        (["serve", "--module", "/api/x=" + os.path.join(env.bad, "missing")], "missing"),
        (["speak", "--model", env.m("tts"), "--voice", env.voice, "--padding-between", "100000000000", "hi", "o.wav"], "--padding-between"),
        (["speak", "--model", env.m("tts"), "--voice", env.voice, "--padding-bonus", "NaN", "hi", "o.wav"], "--padding-bonus"),
        (["speak", "--model", env.m("tts"), "--voice", env.voice, "--cfg-coef", "100", "hi", "o.wav"], "cfg"),
        (["speak", "--model", a, "hi", "o.wav"], "tts"),
        (["file", "--model", env.m("tts"), env.wav, "o.wav"], "speak"),
        (["transcribe", "--model", a, env.wav], "speech"),
        (["chat", "--model", a, "--duration-s", "1"], "device"),
        (["chat", "--model", a, "--input-device", "\u001b[2Jnope"], "device"),
        (["transcribe", "--mic", "--model", env.m("stt"), "--duration-s", "1"], "device"),
        (["--log", "\u001b[31m=debug", "devices"], "--log"),
        (["file", "--model", a, env.wav, "o.wav", "--weights", env.m("hibiki", "model.safetensors")], "model.safetensors"),
        (["file", "--model", a, "--mimi", env.m("a", "model.safetensors"), env.wav, "o.wav"], "mimi"),
        (["inspect", env.wav], "wav"),
        (["file", "--model", os.path.join(env.bad, "missing"), env.wav, "o.wav"], "missing"),
        (["file", "--model", "../../etc", env.wav, "o.wav"], "etc"),
    ]
    # Names with control characters (a file name is text from outside too).
    esc_dir = os.path.join(env.bad, "m\x1b[2J\u202e")
    if not os.path.exists(esc_dir):
        shutil.copytree(a, esc_dir, ignore=shutil.ignore_patterns("input*", "*.q*"))
        os.remove(os.path.join(esc_dir, "tokenizer.model"))
    flags += [
        (["file", "--model", a, os.path.join(env.bad, "in\x1b]0;x\x07.wav"), "o.wav"], "in"),
        (["file", "--model", esc_dir, env.wav, "o.wav"], "tokenizer"),
        (["inspect", os.path.join(env.bad, "\x1b[31m\r.safetensors")], "safetensors"),
        (["codec", "encode", "--model", a, env.wav, "\x1b[2J/o.npy"], "o.npy"),
        (["speak", "--model", env.m("tts"), "--voice", "\x1b[2J", "hi", "o.wav"], "--voice"),
        (["serve", "--model", a, "--static", "\x1b[2J\u202e"], "--static"),
    ]
    for argv, names in flags:
        cases.append(Case("flags", " ".join(x for x in argv if not x.startswith("/"))[:90], argv,
                          expect="error", names=(names,), may_write=("o.wav", "o.npy", "o.safetensors"), timeout_s=30))
    return cases


# ---------------------------------------------------------------------------------------------
# Server


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        return None
    return None


def http_get(port, path="/api/health", timeout=5.0, source="127.0.0.2"):
    # From an address of its own: the server shares its pending connections among addresses,
    # so a client elsewhere must get through whatever one address does.
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    except socket.timeout:
        pass
    s.close()
    return data


def ws_connect(port, path, timeout=5.0, headers=""):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{headers}\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b:
            break
        head += b
    return s, head


def ws_frame(opcode, payload, fin=True, mask=True, rsv=0, length=None):
    n = len(payload) if length is None else length
    b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
    if n < 126:
        hdr = bytes([b0, (0x80 if mask else 0) | n])
    elif n < 65536:
        hdr = bytes([b0, (0x80 if mask else 0) | 126]) + struct.pack(">H", n)
    else:
        hdr = bytes([b0, (0x80 if mask else 0) | 127]) + struct.pack(">Q", n)
    if not mask:
        return hdr + payload
    key = b"\x01\x02\x03\x04"
    return hdr + key + bytes(c ^ key[i % 4] for i, c in enumerate(payload))


def msgpack(v):
    if isinstance(v, dict):
        out = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))
        for k, x in v.items():
            out += msgpack(k) + msgpack(x)
        return out
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xA0 | len(b)]) if len(b) < 32 else b"\xda" + struct.pack(">H", len(b)) if len(b) < 65536 else b"\xdb" + struct.pack(">I", len(b))) + b
    if isinstance(v, bytes):
        return b"\xc6" + struct.pack(">I", len(v)) + v
    if isinstance(v, float):
        return b"\xca" + struct.pack(">f", v)
    if isinstance(v, bool):
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int):
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, list):
        out = b"\xdd" + struct.pack(">I", len(v))
        for x in v:
            out += msgpack(x)
        return out
    raise TypeError(v)


def drain(s, seconds):
    """Reads until the peer closes or `seconds` pass: True when it closed."""
    end = time.time() + seconds
    s.settimeout(0.2)
    while time.time() < end:
        try:
            b = s.recv(65536)
            if not b:
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def server_attacks():
    """(name, endpoint, function(port) -> problem or None). Each leaves the server serving."""
    attacks = []

    def idle_sockets(n, send=b"", addresses=1, wait_s=0.3):
        def go(port):
            socks = []
            for i in range(n):
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2,
                                                 source_address=(f"127.0.1.{1 + i % addresses}", 0))
                    if send:
                        s.sendall(send)
                    socks.append(s)
                except OSError:
                    pass
            time.sleep(wait_s)
            reply = http_get(port, timeout=5)
            for s in socks:
                s.close()
            if b" 200 " not in reply.split(b"\r\n")[0] + b" ":
                return f"health check refused beside {n} idle connections: {reply[:60]!r}"
        return go

    for n in (70, 150, 300):
        attacks.append((f"{n} idle TCP connections", None, idle_sockets(n)))
    attacks.append(("200 unfinished request heads", None, idle_sockets(200, b"GET / HTTP/1.1\r\nHost: x\r\n")))
    attacks.append(("200 connections sending one header byte", None, idle_sockets(200, b"G")))
    attacks.append(("100 idle connections from 10 addresses", None, idle_sockets(100, addresses=10, wait_s=1.5)))
    attacks.append(("300 unfinished heads from 30 addresses", None,
                    idle_sockets(300, b"GET / HTTP/1.1\r\n", addresses=30, wait_s=1.5)))

    def big_head(size, expect_431=True):
        def go(port):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            try:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * size + b"\r\n\r\n")
                reply = s.recv(200)
            except OSError:
                reply = b""  # closed while the head was still coming: refused
            s.close()
            if expect_431 and b"431" not in reply and reply:
                return f"{size}-byte header got {reply[:40]!r}"
        return go

    for size in (33 * 1024, 100 * 1024, 4 << 20):
        attacks.append((f"request head of {size} bytes", None, big_head(size)))

    def many_headers(port):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 5000 + b"\r\n")
            reply = s.recv(200)
        except OSError:
            reply = b""
        s.close()
        if reply and b"431" not in reply and b"400" not in reply:
            return f"5000 headers got {reply[:40]!r}"
    attacks.append(("5000 header lines", None, many_headers))

    def static_path(path, ok=(b"404", b"400", b"414", b"200")):
        def go(port):
            r = http_get(port, path)
            status = r.split(b"\r\n")[0]
            if not any(c in status for c in ok):
                return f"GET {path[:40]} -> {status!r}"
        return go

    for p in ("/" + "a" * 300, "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/%00", "/" + "a/" * 3000,
              "/index.html%00.js", "/%ff%fe", "/\x1b[2J"):
        attacks.append((f"static {p[:30]!r}", None, static_path(p)))

    # Websocket endpoints.
    def ws_attack(kind):
        def go(port, path):
            s, head = ws_connect(port, path)
            if b" 101 " not in head:
                s.close()
                return None  # refused before the upgrade is fine (busy, wrong module)
            try:
                if kind == "idle":
                    closed = drain(s, 6)
                    if not closed:
                        return "an idle websocket was not closed within 6 s (idle timeout 2 s)"
                elif kind == "huge-length":
                    s.sendall(ws_frame(2, b"", length=1 << 62)[:-0 or None] + b"\0" * 1024)
                    if not drain(s, 5):
                        return "a frame announcing 2^62 bytes did not close the session"
                elif kind == "big-message":
                    s.sendall(ws_frame(2, b"\x01" + os.urandom(2 << 20)))
                    if not drain(s, 8):
                        return "a 2 MiB message did not close the session"
                elif kind == "unmasked":
                    s.sendall(ws_frame(2, b"\x01abc", mask=False))
                    if not drain(s, 5):
                        return "an unmasked client frame did not close the session"
                elif kind == "rsv":
                    s.sendall(ws_frame(2, b"\x01abc", rsv=7))
                    if not drain(s, 5):
                        return "RSV bits did not close the session"
                elif kind == "opcode":
                    s.sendall(ws_frame(3, b"abc"))
                    if not drain(s, 5):
                        return "a reserved opcode did not close the session"
                elif kind == "bad-utf8":
                    s.sendall(ws_frame(1, b"\xff\xfe"))
                    if not drain(s, 5):
                        return "invalid UTF-8 did not close the session"
                elif kind == "fragmented-ping":
                    s.sendall(ws_frame(9, b"x", fin=False))
                    if not drain(s, 5):
                        return "a fragmented ping did not close the session"
                elif kind == "ping-flood":
                    s.settimeout(5)
                    try:
                        for _ in range(20000):
                            s.sendall(ws_frame(9, b"p" * 100))
                    except OSError:
                        pass
                elif kind == "fragments-forever":
                    s.settimeout(5)
                    try:
                        s.sendall(ws_frame(2, b"\x01", fin=False))
                        for _ in range(3000):
                            s.sendall(ws_frame(0, os.urandom(1000), fin=False))
                    except OSError:
                        pass
                    drain(s, 3)
                elif kind == "garbage-messages":
                    for i in range(200):
                        try:
                            s.sendall(ws_frame(2, bytes([i % 256]) + os.urandom(random.Random(i).randint(0, 3000))))
                        except OSError:
                            break
                    drain(s, 3)
                elif kind == "msgpack-huge-array":
                    s.sendall(ws_frame(2, b"\xdd\xff\xff\xff\xff" + b"\xc0" * 100))
                    drain(s, 3)
                elif kind == "msgpack-huge-str":
                    s.sendall(ws_frame(2, b"\x81\xa4type\xdb\xff\xff\xff\xff" + b"a" * 100))
                    drain(s, 3)
                elif kind == "msgpack-deep":
                    s.sendall(ws_frame(2, b"\x91" * 100000))
                    drain(s, 3)
                elif kind == "asr-audio-nan":
                    s.sendall(ws_frame(2, msgpack({"type": "Audio", "pcm": [float("nan")] * 1920})))
                    drain(s, 3)
                elif kind == "asr-audio-10s":
                    s.sendall(ws_frame(2, msgpack({"type": "Audio", "pcm": [0.1] * 240000})))
                    if not drain(s, 8):
                        return "10 s of audio in one message did not end the session"
                elif kind == "tts-text-never-read":
                    s.settimeout(5)
                    try:
                        for _ in range(200):
                            s.sendall(ws_frame(2, msgpack({"type": "Text", "text": "hello world " * 100})))
                        s.sendall(ws_frame(2, msgpack({"type": "Eos"})))
                    except OSError:
                        pass
                    time.sleep(4)
                elif kind == "tts-text-controls":
                    s.sendall(ws_frame(2, msgpack({"type": "Text", "text": "\x1b[2J\x07\u202e hi"})))
                    s.sendall(ws_frame(2, msgpack({"type": "Eos"})))
                    drain(s, 6)
                elif kind == "chat-ogg-garbage":
                    s.sendall(ws_frame(2, b"\x01OggS" + os.urandom(3000)))
                    if not drain(s, 5):
                        return "garbage Ogg did not end the session"
                elif kind == "chat-kind-unknown":
                    s.sendall(ws_frame(2, b"\x7fhello\x1b[2J"))
                    drain(s, 3)
                elif kind == "close-bad-code":
                    s.sendall(ws_frame(8, struct.pack(">H", 999) + b"\xff"))
                    drain(s, 3)
            finally:
                s.close()
        return go

    kinds = ["idle", "huge-length", "big-message", "unmasked", "rsv", "opcode", "bad-utf8", "fragmented-ping",
             "ping-flood", "fragments-forever", "garbage-messages", "msgpack-huge-array", "msgpack-huge-str",
             "msgpack-deep", "close-bad-code"]
    endpoint_kinds = {
        "/api/chat": kinds + ["chat-ogg-garbage", "chat-kind-unknown"],
        "/api/asr-streaming": kinds + ["asr-audio-nan", "asr-audio-10s"],
        "/api/tts_streaming": kinds + ["tts-text-never-read", "tts-text-controls"],
    }
    for ep, ks in endpoint_kinds.items():
        for k in ks:
            attacks.append((f"{ep} {k}", ep, ws_attack(k)))

    def busy_flood(ep):
        def go(port, path):
            socks = []
            for _ in range(12):
                try:
                    s, head = ws_connect(port, path)
                    socks.append(s)
                except OSError:
                    pass
            time.sleep(0.5)
            for s in socks:
                s.close()
        return go
    for ep in endpoint_kinds:
        attacks.append((f"{ep} 12 sessions at once (max 2)", ep, busy_flood(ep)))
    return attacks


def server_cases(env, binary, verbose):
    """One serve process (three modules), attacked; after each attack it must still answer."""
    results = []
    port = free_port()
    argv = [binary, "serve", "--module", "/api/chat=" + env.m("a"), "--module", "/api/asr-streaming=" + env.m("stt"),
            "--module", "/api/tts_streaming=" + env.m("tts"), "--port", str(port), "--idle-timeout-s", "2",
            "--max-sessions", "2", "--static", "none", "--log", "warn"]
    log = open(os.path.join(env.work, "serve.log"), "wb")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=env.work,
                         env=dict(os.environ, RAYON_NUM_THREADS="1"))
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if b" 200 " in http_get(port, "/api/ready", 1):
                break
        except OSError:
            time.sleep(0.3)
    else:
        p.kill()
        return [("server", "serve starts", "defect", ["serve did not become ready: " + open(log.name, "rb").read()[-300:].decode("utf-8", "replace")])]
    rss_cap_mib = 400
    for name, ep, attack in server_attacks():
        problem = None
        try:
            problem = attack(port, ep) if ep else attack(port)
        except Exception as e:  # a refused or reset connection is the server's right
            if not isinstance(e, OSError):
                problem = f"attack raised {e!r}"
        time.sleep(0.2)
        reasons = [problem] if problem else []
        if p.poll() is not None:
            reasons.append(f"serve exited with {p.returncode}")
        else:
            try:
                ok = b" 200 " in http_get(port, "/api/health", 5).split(b"\r\n")[0] + b" "
            except OSError as e:
                ok = False
            if not ok:
                time.sleep(2)
                try:
                    ok = b" 200 " in http_get(port, "/api/health", 5).split(b"\r\n")[0] + b" "
                except OSError:
                    ok = False
            if not ok:
                reasons.append("serve stopped answering /api/health")
            rss = rss_mib(p.pid)
            if rss is not None and rss > rss_cap_mib:
                reasons.append(f"serve RSS {rss:.0f} MiB above {rss_cap_mib} MiB")
        verdict = "defect" if reasons else "clean"
        results.append(("server", name, verdict, reasons))
        if verbose:
            print(f"  [{verdict}] server: {name} {'; '.join(reasons)}", flush=True)
        if p.poll() is not None:
            break
    # A normal session still works at the end: a websocket upgrade on each module.
    for ep in ("/api/chat", "/api/asr-streaming", "/api/tts_streaming"):
        reasons = []
        if p.poll() is None:
            s, head = ws_connect(port, ep)
            if b" 101 " not in head:
                reasons.append(f"no websocket upgrade after the attacks: {head[:60]!r}")
            s.close()
        else:
            reasons.append("serve is gone")
        results.append(("server", f"{ep} upgrade after all attacks", "defect" if reasons else "sane", reasons))
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(40)
    except subprocess.TimeoutExpired:
        p.kill()
        results.append(("server", "serve ends on SIGTERM", "defect", ["serve did not end within 40 s of SIGTERM"]))
    log.close()
    text = open(log.name, "rb").read().decode("utf-8", "replace")
    bad = [l for l in text.splitlines() if CONTROL.search(l)]
    results.append(("server", "log carries no raw control characters", "defect" if bad else "sane",
                    [f"raw control character in the log: {bad[0][:120]!r}"] if bad else []))
    panics = [l for l in text.splitlines() if "panicked" in l]
    results.append(("server", "log shows no panic", "defect" if panics else "sane", panics[:1]))
    return results


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "release", "moshi-rs"))
    ap.add_argument("--only", default="", help="comma-separated classes: outputs,signals,stdout,readers,flags,server")
    ap.add_argument("--match", default="", help="only the cases whose name contains this")
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--json", help="write every case's verdict here")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary}: not an executable (cargo build --release -p moshi-cli)")
    only = set(filter(None, args.only.split(",")))
    rnd = random.Random(args.seed)
    top = tempfile.mkdtemp(prefix="hostile-sweep-")
    work = os.path.join(top, "w")
    os.makedirs(work)
    started = time.time()
    env = Env(binary, work)
    cases = []
    for klass, make in (("outputs", lambda: output_cases(env) + committed_together_cases(env)),
                        ("signals", lambda: signal_cases(env, rnd)), ("stdout", lambda: stdout_cases(env)),
                        ("readers", lambda: reader_cases(env)), ("flags", lambda: flag_cases(env))):
        if not only or klass in only:
            cases += make()
    if args.match:
        cases = [c for c in cases if args.match in c.name]
    results = []
    for i, case in enumerate(cases):
        case_dir = os.path.join(work, f"case{i}")
        os.makedirs(case_dir)
        if case.setup:
            case.setup(case_dir)
        before = snapshot(work)
        r = run_binary(binary, case, case_dir)
        after = snapshot(work)
        verdict, reasons = classify(case, r, before, after, case_dir, work)
        results.append((case.klass, case.name, verdict, reasons))
        if args.verbose or verdict == "defect":
            print(f"[{verdict}] {case.klass}: {case.name} (exit {r.rc}, {r.maxrss_mib:.0f} MiB)"
                  + ("\n    " + "\n    ".join(reasons) if reasons else "")
                  + ("\n    stderr: " + r.err.decode("utf-8", "replace").strip()[-300:] if verdict == "defect" else ""),
                  flush=True)
        if any(p.startswith("models") for p in set(before) ^ set(after)) or any(
                after.get(p) != st for p, st in before.items() if p.startswith(("models", "inputs"))):
            env.restore()
        shutil.rmtree(case_dir, ignore_errors=True)
    if not only or "server" in only:
        results += server_cases(env, binary, args.verbose)
    counts = {v: sum(1 for r in results if r[2] == v) for v in ("clean", "sane", "defect")}
    print(f"\n{len(results)} cases: {counts['clean']} clean, {counts['sane']} sane, {counts['defect']} defects"
          f" ({time.time() - started:.0f} s, seed {args.seed}, {binary})")
    by_class = {}
    for klass, _, verdict, _ in results:
        by_class.setdefault(klass, {"clean": 0, "sane": 0, "defect": 0})[verdict] += 1
    for klass, c in by_class.items():
        print(f"  {klass:8} {sum(c.values()):4} cases: {c['clean']} clean, {c['sane']} sane, {c['defect']} defects")
    for klass, name, verdict, reasons in results:
        if verdict == "defect":
            print(f"  DEFECT {klass}: {name}: {'; '.join(reasons)}")
    if args.json:
        json.dump([{"class": k, "case": n, "verdict": v, "reasons": r} for k, n, v, r in results],
                  open(args.json, "w"), indent=1)
    if not args.keep:
        for d, _, fs in os.walk(top):
            for f in fs:
                try:
                    os.chmod(os.path.join(d, f), 0o644)
                except OSError:
                    pass
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(env.pristine, ignore_errors=True)
    sys.exit(1 if counts["defect"] else 0)


if __name__ == "__main__":
    main()
