#!/usr/bin/env python3
"""Latency plots for moshi-rs: a per-frame profile (JSON Lines from `--profile FILE`) or a
`moshi-rs bench --json FILE` report -> one SVG with a latency histogram and a per-stage timeline.

Standard library only (no matplotlib):

    python3 scripts/plot_profile.py profile.jsonl -o profile.svg
    python3 scripts/plot_profile.py bench.json -o bench.svg [--budget-ms 80] [--title TEXT]

Inputs
  * JSON Lines: one object per line; objects with "event": "frame" are frames (other events,
    such as the final "summary", are ignored).
  * bench JSON: an object with "schema_version" and a "frames" list of the same frame objects.
A frame object has "frame" (index), "total_ms", optional "t_ms" (wall clock at the end of the
frame) and one "<stage>_ms" number per stage (mimi_encode_ms, lm_temporal_ms, lm_depformer_ms,
sampling_ms, mimi_decode_ms, ...). Unknown *_ms fields are plotted as extra stages.

Output: an SVG with (top) the histogram of the per-frame total with the frame budget and the
p50/p99 marks, and (bottom) one stacked bar per frame split by stage, with the budget line.
"""

import argparse
import json
import math
import sys
from xml.sax.saxutils import escape

STAGE_ORDER = ["mimi_encode_ms", "lm_temporal_ms", "lm_depformer_ms", "sampling_ms", "mimi_decode_ms"]
# Fields ending in _ms that are not stages of the frame computation.
NOT_STAGES = {"total_ms", "t_ms", "mic_backlog_ms", "speaker_queue_ms"}
COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]


class InputError(Exception):
    """The input file is not a profile or bench report this script understands."""


def load_frames(path):
    """Returns the list of frame dicts in `path` (bench JSON or profile JSON Lines)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e}") from e
    stripped = text.lstrip()
    frames = None
    if stripped.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None  # several objects: JSON Lines
        if isinstance(doc, dict):
            if "frames" in doc:
                frames = doc["frames"]
            elif doc.get("event") == "frame":
                frames = [doc]
    if frames is None:
        frames = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{number}: not a JSON object: {e}") from e
            if isinstance(obj, dict) and obj.get("event", "frame") == "frame" and "total_ms" in obj:
                frames.append(obj)
    if not isinstance(frames, list):
        raise InputError(f"{path}: `frames` is not a list")
    for i, fr in enumerate(frames):
        if not isinstance(fr, dict) or not isinstance(fr.get("total_ms"), (int, float)):
            raise InputError(f"{path}: frame {i} has no numeric `total_ms`")
    if not frames:
        raise InputError(f"{path}: no frame records (expected `\"event\": \"frame\"` lines or a bench report)")
    return frames


def stage_names(frames):
    """Stage fields present in the frames, pipeline order first, then any other *_ms field."""
    present = []
    for fr in frames:
        for key, value in fr.items():
            if key.endswith("_ms") and key not in NOT_STAGES and isinstance(value, (int, float)) and key not in present:
                present.append(key)
    known = [s for s in STAGE_ORDER if s in present]
    return known + [s for s in present if s not in known]


def percentile(sorted_values, p):
    """Nearest-rank percentile (as moshi_runtime::metrics::Percentiles)."""
    n = len(sorted_values)
    rank = min(max(int(math.ceil(p / 100.0 * n)), 1), n)
    return sorted_values[rank - 1]


def nice_step(span, target_ticks=6):
    """A 1/2/5 x 10^k tick step giving about `target_ticks` ticks over `span`."""
    if span <= 0:
        return 1.0
    raw = span / target_ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt(v):
    return f"{v:.1f}"


class Svg:
    def __init__(self, width, height):
        self.width, self.height, self.items = width, height, []

    def rect(self, x, y, w, h, fill, title=None, opacity=None):
        extra = f' fill-opacity="{opacity}"' if opacity is not None else ""
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.items.append(f'<rect x="{fmt(x)}" y="{fmt(y)}" width="{fmt(max(w, 0))}" height="{fmt(max(h, 0))}" fill="{fill}"{extra}>{tip}</rect>')

    def line(self, x1, y1, x2, y2, stroke="#333", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(f'<line x1="{fmt(x1)}" y1="{fmt(y1)}" x2="{fmt(x2)}" y2="{fmt(y2)}" stroke="{stroke}" stroke-width="{width}"{d}/>')

    def text(self, x, y, s, size=11, anchor="start", fill="#222", weight="normal"):
        self.items.append(
            f'<text x="{fmt(x)}" y="{fmt(y)}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" font-weight="{weight}">{escape(s)}</text>'
        )

    def render(self):
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
            f'viewBox="0 0 {self.width} {self.height}" font-family="sans-serif">'
        )
        return "\n".join([head, f'<rect width="{self.width}" height="{self.height}" fill="white"/>'] + self.items + ["</svg>\n"])


def draw_histogram(svg, frames, budget_ms, x0, y0, w, h):
    totals = sorted(float(f["total_ms"]) for f in frames)
    lo, hi = 0.0, max(totals[-1], budget_ms) * 1.05
    bins = max(10, min(60, int(math.sqrt(len(totals)) * 3)))
    width_ms = (hi - lo) / bins
    counts = [0] * bins
    for v in totals:
        counts[min(int((v - lo) / width_ms), bins - 1)] += 1
    top = max(counts)
    svg.text(x0, y0 - 8, f"Per-frame total latency ({len(totals)} frames)", size=13, weight="bold")
    svg.line(x0, y0 + h, x0 + w, y0 + h)
    svg.line(x0, y0, x0, y0 + h)
    for i, c in enumerate(counts):
        if c:
            bh = h * c / top
            svg.rect(x0 + w * i / bins + 0.5, y0 + h - bh, w / bins - 1, bh, COLORS[0],
                     title=f"{lo + i * width_ms:.1f}-{lo + (i + 1) * width_ms:.1f} ms: {c} frames")
    step = nice_step(hi - lo)
    t = 0.0
    while t <= hi:
        x = x0 + w * (t - lo) / (hi - lo)
        svg.line(x, y0 + h, x, y0 + h + 4)
        svg.text(x, y0 + h + 16, f"{t:g}", anchor="middle", size=10)
        t += step
    svg.text(x0 + w / 2, y0 + h + 32, "ms per frame", anchor="middle")
    svg.text(x0 - 8, y0 + 10, str(top), anchor="end", size=10)
    svg.text(x0 - 8, y0 + h, "0", anchor="end", size=10)
    marks = [("budget", budget_ms, "#c00", "6,3"), ("p50", percentile(totals, 50), "#333", "2,2"),
             ("p99", percentile(totals, 99), "#333", "2,2")]
    for i, (name, v, color, dash) in enumerate(marks):
        x = x0 + w * (v - lo) / (hi - lo)
        svg.line(x, y0, x, y0 + h, stroke=color, width=1.5, dash=dash)
        svg.text(x + 3, y0 + 12 + 13 * i, f"{name} {v:.1f} ms", size=10, fill=color)


def draw_timeline(svg, frames, stages, budget_ms, x0, y0, w, h):
    n = len(frames)
    peak = max(max(float(f["total_ms"]) for f in frames), budget_ms) * 1.05
    svg.text(x0, y0 - 8, "Timeline: time per frame by stage", size=13, weight="bold")
    svg.line(x0, y0 + h, x0 + w, y0 + h)
    svg.line(x0, y0, x0, y0 + h)
    bar = w / n
    for i, fr in enumerate(frames):
        x = x0 + i * bar
        y = y0 + h
        for s, name in enumerate(stages):
            v = float(fr.get(name, 0.0) or 0.0)
            bh = h * v / peak
            y -= bh
            svg.rect(x + bar * 0.1, y, bar * 0.8, bh, COLORS[s % len(COLORS)],
                     title=f"frame {fr.get('frame', i)}: {name[:-3]} {v:.2f} ms")
        other = float(fr["total_ms"]) - sum(float(fr.get(s, 0.0) or 0.0) for s in stages)
        if other > 0:
            bh = h * other / peak
            svg.rect(x + bar * 0.1, y - bh, bar * 0.8, bh, "#bbbbbb",
                     title=f"frame {fr.get('frame', i)}: other {other:.2f} ms")
    step = nice_step(peak)
    t = 0.0
    while t <= peak:
        y = y0 + h - h * t / peak
        svg.line(x0 - 4, y, x0, y)
        svg.text(x0 - 6, y + 3, f"{t:g}", anchor="end", size=10)
        t += step
    yb = y0 + h - h * budget_ms / peak
    svg.line(x0, yb, x0 + w, yb, stroke="#c00", width=1.5, dash="6,3")
    svg.text(x0 + w - 2, yb - 4, f"budget {budget_ms:g} ms", anchor="end", size=10, fill="#c00")
    tick = max(1, int(nice_step(n, 8)))
    for i in range(0, n, tick):
        svg.text(x0 + (i + 0.5) * bar, y0 + h + 14, str(frames[i].get("frame", i)), anchor="middle", size=10)
    svg.text(x0 + w / 2, y0 + h + 30, "frame", anchor="middle")
    svg.text(x0 - 40, y0 + h / 2, "ms", anchor="middle")
    lx = x0
    for s, name in enumerate(stages + ["other"]):
        color = COLORS[s % len(COLORS)] if name != "other" else "#bbbbbb"
        svg.rect(lx, y0 + h + 40, 10, 10, color)
        label = name[:-3] if name.endswith("_ms") else name
        svg.text(lx + 14, y0 + h + 49, label, size=10)
        lx += 24 + 6.5 * len(label)


def render(frames, budget_ms, title):
    stages = stage_names(frames)
    svg = Svg(900, 720)
    svg.text(450, 24, title, size=15, anchor="middle", weight="bold")
    draw_histogram(svg, frames, budget_ms, 70, 60, 800, 230)
    draw_timeline(svg, frames, stages, budget_ms, 70, 380, 800, 260)
    return svg.render()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("input", help="profile JSON Lines (--profile) or bench report (bench --json)")
    parser.add_argument("-o", "--output", help="SVG to write (default: the input path with .svg)")
    parser.add_argument("--budget-ms", type=float, default=80.0, help="frame budget line (default 80 ms)")
    parser.add_argument("--title", default=None, help="plot title (default: the input file name)")
    args = parser.parse_args(argv)
    try:
        frames = load_frames(args.input)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    output = args.output or (args.input.rsplit(".", 1)[0] + ".svg")
    title = args.title or f"moshi-rs latency: {args.input}"
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(render(frames, args.budget_ms, title))
    except OSError as e:
        print(f"error: {output}: cannot write: {e}", file=sys.stderr)
        return 1
    totals = sorted(float(f["total_ms"]) for f in frames)
    print(f"{output}: {len(frames)} frames, p50 {percentile(totals, 50):.2f} ms, p99 {percentile(totals, 99):.2f} ms, "
          f"max {totals[-1]:.2f} ms (budget {args.budget_ms:g} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
