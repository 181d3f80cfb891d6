"""Compares a reference signal with a recording of it (for the `moshi-rs serve` client tests).

  audio_check.py find REF REC [--min-ncc X]
      Finds REF inside REC (FFT cross-correlation). Prints lag (samples, REC later when > 0)
      and ncc over the overlap. Exit 1 if ncc < X.
  audio_check.py heard REF REC [--window-s 0.48] [--min-ncc 0.9] [--allowed-low N] [--min-windows 1]
                               [--skip-s 0]
      REC is what a server processed while a client's microphone played REF, once or in a loop
      (a browser's fake capture device): every loud window of REC must be found somewhere in
      REF with ncc >= X. A frame the server dropped (compute behind) splices two pieces
      together, so up to N windows (the drops the server counted) may fall below. Exit 1
      otherwise.
      --allowed-capture-gaps K [--capture-gap-ms 10]: up to K more windows may fall below if
      each matches with ncc >= X once 10 ms of silence is inserted inside it: a capture underrun
      of the client (Chromium's audio thread took a 10 ms chunk before its fake capture device
      had delivered it and got silence; REC then runs 10 ms later than REF from there on). Seen
      in 4 of 8 runs of the browser test on 2 cores, each time exactly 240 samples of silence at
      24 kHz, less than any unit the server handles (a 20 ms Opus packet, an 80 ms frame).
      Each window below X is printed with its 60 ms pieces' places in REF: the delay of each
      piece against the window's first (+10 ms from some piece on: one underrun; +20: two; a
      negative delay: audio lost) and its ncc (a low one: that stretch itself was corrupted).
  audio_check.py windows REF REC [--window-s 0.5] [--min-ncc 0.99] [--tolerance 2] [--search-s 1]
                                 [--skip-s 0] [--client-blocks N]
      Cuts REF (from --skip-s on) into windows, finds each loud one in REC near the global lag,
      and checks that every window sits at the same lag (within --tolerance samples) with ncc >=
      --min-ncc: a clean path has one constant lag; a lag that moves is inserted or lost audio (a
      click or a skip). Windows that would lie past REC's last sound are not checked (the player
      had stopped: e.g. the end of what was sent while the client was closing); --min-windows
      says how many must be. Prints a summary and one line per window that moved. Exit 1 on any
      jump or low ncc, or too few windows.
      --client-blocks N: the player inserts whole blocks of N samples of digital silence when it
      has nothing to play (Kyutai's Python client does, and prints [LAG] for each). Runs of exact
      zeros inside REC that are whole blocks long are counted (printed as inserted_blocks=K) and
      cut out before the check; any other run of N or more zeros is an error.

WAV files: 16-bit integer or 32-bit float, any channel count (mixed to mono); both files must
have the same rate.
"""
import argparse
import struct
import sys

import numpy as np


def read_wav(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        sys.exit(f"{path}: not a WAV file")
    pos, fmt, samples = 12, None, None
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        body = data[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            tag, channels, rate = struct.unpack("<HHI", body[:8])
            bits = struct.unpack("<H", body[14:16])[0]
            if tag == 0xFFFE:  # WAVE_FORMAT_EXTENSIBLE: the real tag is in the sub-format
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            samples = body
        pos += 8 + size + (size & 1)
    if fmt is None or samples is None:
        sys.exit(f"{path}: no fmt or data chunk")
    tag, channels, rate, bits = fmt
    if tag == 1 and bits == 16:
        x = np.frombuffer(samples[: len(samples) // 2 * 2], dtype="<i2").astype(np.float64) / 32768.0
    elif tag == 3 and bits == 32:
        x = np.frombuffer(samples[: len(samples) // 4 * 4], dtype="<f4").astype(np.float64)
    else:
        sys.exit(f"{path}: unsupported WAV format (tag {tag}, {bits} bits)")
    x = x[: len(x) // channels * channels].reshape(-1, channels).mean(axis=1)
    return x, rate


def ncc(a, b):
    """Normalised cross-correlation of two equal-length signals at lag 0 (0 if either is silent)."""
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(np.dot(a, b) / den) if den > 0 else 0.0


def find(ref, rec):
    """(lag, ncc): REC[i + lag] ~ REF[i]."""
    n = len(ref) + len(rec)
    nfft = 1 << (n - 1).bit_length()
    c = np.fft.irfft(np.fft.rfft(rec, nfft) * np.conj(np.fft.rfft(ref, nfft)), nfft)
    c = np.concatenate([c[nfft - len(ref) + 1 :], c[: len(rec)]])
    lag = int(np.argmax(c)) - (len(ref) - 1)
    r0, s0 = (0, lag) if lag >= 0 else (-lag, 0)
    m = min(len(ref) - r0, len(rec) - s0)
    return lag, ncc(ref[r0 : r0 + m], rec[s0 : s0 + m])


def windows(ref, rec, rate, window_s, search_s, lag, skip_s=0.0):
    """For every loud window of REF after `skip_s`: (start, best lag, ncc) when searched in REC
    around `lag`."""
    w = int(window_s * rate)
    search = int(search_s * rate)
    nonzero = np.flatnonzero(rec != 0.0)
    rec_end = nonzero[-1] + 1 if len(nonzero) else 0
    out = []
    for st in range(int(skip_s * rate), len(ref) - w + 1, w):
        seg = ref[st : st + w]
        if np.sqrt(np.mean(seg**2)) < 0.01 or st + lag + w > rec_end:
            continue
        a0 = max(0, st + lag - search)
        a1 = min(len(rec), st + lag + w + search)
        x = rec[a0:a1]
        if len(x) < w:
            out.append((st, None, 0.0))
            continue
        valid = len(x) - w + 1
        nfft = 1 << (len(x) + w - 1).bit_length()
        cc = np.fft.irfft(np.fft.rfft(x, nfft) * np.conj(np.fft.rfft(seg, nfft)), nfft)[:valid]
        c2 = np.concatenate([[0.0], np.cumsum(x**2)])
        energy = np.sqrt(np.maximum(c2[w:] - c2[:-w], 0.0))[:valid] * np.linalg.norm(seg) + 1e-12
        k = int(np.argmax(cc / energy))
        out.append((st, a0 + k - st, float(cc[k] / energy[k])))
    return out


def cut_inserted_blocks(rec, block, tolerance):
    """Removes whole blocks of digital silence from inside `rec` (between its first and last
    non-zero sample). Returns (rec without them, blocks removed, [(start, length)] of zero runs
    that are no whole number of blocks)."""
    nonzero = np.flatnonzero(rec != 0.0)
    if len(nonzero) == 0:
        return rec, 0, []
    first, last = nonzero[0], nonzero[-1]
    zero = np.concatenate([[False], rec[first : last + 1] == 0.0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    keep, removed, odd, pos = [], 0, [], 0
    for start, end in zip(edges[0::2], edges[1::2]):
        length = end - start
        if length < block - tolerance:
            continue
        k = int(round(length / block))
        if abs(length - k * block) > tolerance:
            odd.append((first + start, length))
        k = min(k, length // block)
        keep.append(rec[pos : first + start])
        pos = first + start + k * block
        removed += k
    keep.append(rec[pos:])
    return np.concatenate(keep), removed, odd


def best_place(seg, ref):
    """(position, ncc) of the best match of `seg` in `ref` (len(ref) >= len(seg))."""
    w = len(seg)
    valid = len(ref) - w + 1
    nfft = 1 << (len(ref) + w - 1).bit_length()
    cc = np.fft.irfft(np.fft.rfft(ref, nfft) * np.conj(np.fft.rfft(seg, nfft)), nfft)[:valid]
    c2 = np.concatenate([[0.0], np.cumsum(ref**2)])
    energy = np.sqrt(np.maximum(c2[w:] - c2[:-w], 0.0))[:valid] * np.linalg.norm(seg) + 1e-12
    k = int(np.argmax(cc / energy))
    return k, float(cc[k] / energy[k])


def best_match(seg, ref):
    """Highest ncc of `seg` against every position of `ref` (len(ref) >= len(seg))."""
    return best_place(seg, ref)[1]


def best_match_with_capture_gap(seg, loop, chunk):
    """Highest ncc of `seg` against `loop` with `chunk` samples of silence inserted somewhere
    inside it (a capture underrun: the client's audio thread took a chunk before the capture
    device had delivered it, and got silence): the piece of `seg` before the gap at its best
    place `p`, the piece after it at `p` + its length - `chunk`. The place comes from whichever
    half of `seg` matches best alone (the gap lies in the other one); the gap is searched in steps
    of a tenth of a chunk."""
    w = len(seg)
    half = w // 2
    best = 0.0
    for part, shift in ((seg[:half], 0), (seg[half:], half - chunk)):
        if np.linalg.norm(part) == 0:
            continue
        k, _ = best_place(part, loop)
        p = k - shift
        if p < 0 or p + w > len(loop):
            continue
        for cut in range(0, w - chunk + 1, max(chunk // 10, 1)):
            spliced = np.concatenate([loop[p : p + cut], np.zeros(chunk), loop[p + cut : p + w - chunk]])
            best = max(best, ncc(seg, spliced))
    return best


def looped(ref, w):
    """`ref` played in a loop, each pass followed by `w` samples of silence (so that a window is
    never matched across the end of one pass and the start of the next)."""
    one_pass = np.concatenate([ref, np.zeros(w)])
    return np.concatenate([one_pass] * (2 + w // max(len(ref), 1)))


def pieces_of_window(seg, loop, rate, piece_s=0.06, search_s=0.25):
    """Where each piece (`piece_s` long) of a window that matched poorly lies in `loop`:
    [(start s, delay ms, ncc)], the delay being how much later than the window's first loud piece
    the recording runs at that piece. A capture underrun shows as a delay of +10 ms from one piece
    on (two as +20), lost audio as a negative delay, a corrupted stretch as pieces of low ncc."""
    n = int(piece_s * rate)
    search = int(search_s * rate)
    out, anchor = [], None
    for st in range(0, len(seg) - n + 1, n):
        part = seg[st : st + n]
        if np.sqrt(np.mean(part**2)) < 0.01:
            continue
        if anchor is None:
            k, c = best_place(part, loop)
            anchor = k - st
        else:
            a0 = max(0, anchor + st - search)
            k, c = best_place(part, loop[a0 : anchor + st + n + search])
            k += a0
        out.append((st / rate, (anchor + st - k) * 1000 / rate, c))
    return out


def heard(ref, rec, rate, window_s, skip_s=0.0, gap=0, min_ncc=0.9):
    """(start, ncc, ncc with a capture gap) of every loud window of `rec` (from `skip_s` on) at
    its best place in `ref` played in a loop, or once: the passes are searched with a window of
    silence between them, so that the end of one is never matched against the start of the next.
    The third figure, for `gap` > 0 and a window whose ncc is below `min_ncc`, is its best match
    with `gap` samples of silence inserted inside it (else None)."""
    w = int(window_s * rate)
    loop = looped(ref, w)
    out = []
    for st in range(int(skip_s * rate), len(rec) - w + 1, w):
        seg = rec[st : st + w]
        if np.sqrt(np.mean(seg**2)) < 0.01:
            continue
        c = best_match(seg, loop)
        spliced = best_match_with_capture_gap(seg, loop, gap) if gap and c < min_ncc else None
        out.append((st, c, spliced))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["find", "heard", "windows"])
    p.add_argument("ref")
    p.add_argument("rec")
    p.add_argument("--min-ncc", type=float, default=None)
    p.add_argument("--window-s", type=float, default=None, help="0.5 (windows), 0.48 (heard)")
    p.add_argument("--allowed-low", type=int, default=0)
    p.add_argument("--search-s", type=float, default=1.0)
    p.add_argument("--tolerance", type=int, default=2)
    p.add_argument("--skip-s", type=float, default=0.0, help="windows start this far in (into REF for windows, REC for heard)")
    p.add_argument("--client-blocks", type=int, default=None, help="see the module's help")
    p.add_argument("--min-windows", type=int, default=1)
    p.add_argument("--allowed-capture-gaps", type=int, default=0, help="heard: see the module's help")
    p.add_argument("--capture-gap-ms", type=float, default=10.0, help="heard: see the module's help")
    a = p.parse_args()
    ref, rr = read_wav(a.ref)
    rec, rc = read_wav(a.rec)
    if rr != rc:
        sys.exit(f"sample rates differ: {a.ref} {rr} Hz, {a.rec} {rc} Hz")
    if a.mode == "heard":
        min_ncc = 0.9 if a.min_ncc is None else a.min_ncc
        gap = round(a.capture_gap_ms * rr / 1000)
        found = heard(
            ref, rec, rr, a.window_s or 0.48, a.skip_s, gap if a.allowed_capture_gaps else 0, min_ncc
        )
        low = [(st, c, sp) for st, c, sp in found if c < min_ncc]
        gaps = [(st, c, sp) for st, c, sp in low if sp is not None and sp >= min_ncc]
        gaps = gaps[: a.allowed_capture_gaps]
        unexplained = len(low) - len(gaps)
        nccs = sorted(c for _, c, _ in found)
        print(
            f"windows={len(found)} low_ncc={len(low)} capture_gaps={len(gaps)} "
            f"allowed_low={a.allowed_low} "
            f"min_window_ncc={nccs[0] if nccs else 0:.4f} median_window_ncc={nccs[len(nccs) // 2] if nccs else 0:.4f}"
        )
        for st, c, sp in low:
            why = f", {sp:.4f} with {a.capture_gap_ms:g} ms of silence inserted" if sp is not None else ""
            print(f"  window at {st / rr:.2f} s: ncc {c:.4f}{why}")
            w = int((a.window_s or 0.48) * rr)
            parts = pieces_of_window(rec[st : st + w], looped(ref, w), rr)
            print("    its 60 ms pieces (start s, delay ms, ncc): " + " ".join(f"{p:.2f}/{d:+.1f}/{q:.3f}" for p, d, q in parts))
        sys.exit(0 if len(found) >= a.min_windows and unexplained <= a.allowed_low else 1)
    a.window_s = a.window_s or 0.5
    odd = []
    if a.client_blocks is not None:
        rec, removed, odd = cut_inserted_blocks(rec, a.client_blocks, a.tolerance)
        print(f"inserted_blocks={removed} odd_silences={len(odd)}")
        for start, length in odd:
            print(f"  {length} samples of silence at {start / rr:.2f} s: not whole blocks of {a.client_blocks}")
    lag, ncc = find(ref, rec)
    if a.mode == "find":
        print(f"lag={lag} lag_ms={1000 * lag / rr:.2f} ncc={ncc:.4f}")
        sys.exit(0 if a.min_ncc is None or ncc >= a.min_ncc else 1)
    min_ncc = 0.99 if a.min_ncc is None else a.min_ncc
    found = windows(ref, rec, rr, a.window_s, a.search_s, lag, a.skip_s)
    jumps = [(st, l, c) for st, l, c in found if l is None or abs(l - lag) > a.tolerance]
    low = [(st, l, c) for st, l, c in found if c < min_ncc]
    worst = min((c for _, _, c in found), default=0.0)
    print(
        f"lag={lag} windows={len(found)} jumps={len(jumps)} low_ncc={len(low)} "
        f"min_window_ncc={worst:.4f} global_ncc={ncc:.4f}"
    )
    for st, l, c in sorted(set(jumps + low)):
        moved = "not found" if l is None else f"lag {l} ({l - lag:+d})"
        print(f"  window at {st / rr:.2f} s: {moved}, ncc {c:.4f}")
    if len(found) < a.min_windows:
        print(f"  only {len(found)} windows checked, expected at least {a.min_windows}")
    sys.exit(0 if len(found) >= a.min_windows and not jumps and not low and not odd else 1)


if __name__ == "__main__":
    main()
