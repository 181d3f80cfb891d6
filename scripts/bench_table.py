#!/usr/bin/env python3
"""Markdown tables (docs/performance.md) from `moshi-rs bench --json` reports.

    python3 scripts/bench_table.py bf16.json q8.json q4.json

Prints two tables (a run with classifier-free guidance is labelled with its coefficient, one of
several sessions with "x N"): the measured run (p50 ms per stage, the bytes read per frame by the LM
weights and the temporal KV caches, the bandwidth bound over both and the ratio to it) and, for
reports run with --layers below the config's, the figures extrapolated to full depth. When the
reports include `--sessions` runs, a third table gives for each quant, stage and KV prefill the
frame time of N sessions over the frame time of one (medians over the reports of each N, so
interleaved repeats can be passed together). Standard library only.
"""

import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    if report.get("schema_version") not in (1, 2, 3):
        raise SystemExit(f"error: {path}: schema_version {report.get('schema_version')!r}, this script reads 1 to 3")
    return report


def label(report):
    """The weight format, with the guidance coefficient when the run had two LM rows."""
    run = report["run"]
    rows = run.get("lm_rows", 1)
    name = run["quant"] if rows == 1 else f"{run['quant']} cfg {run['cfg_coef']:g}"
    sessions = run.get("sessions", 1)
    return name if sessions == 1 else f"{name} x {sessions}"


def median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def sessions_rows(reports):
    """Frame time for N sessions over one, per quant, stage and KV prefill (full depth when
    extrapolated, else as run): LM step and whole frame."""
    groups = {}
    for r in reports:
        run = r["run"]
        key = (run["quant"], run["stage"], run.get("kv_prefill_positions", 0), run.get("kv_cache", "f32"))
        x = r.get("extrapolated") or {}
        lm = x.get("lm_step_p50_ms", r["bound"]["lm_measured_p50_ms"])
        frame = x.get("total_p50_ms", r["stages"]["total_ms"]["p50"])
        groups.setdefault(key, {}).setdefault(run.get("sessions", 1), []).append((lm, frame))
    yield ("| quant | stage | KV cache | N | runs | LM step ms | LM step / N=1 | frame ms | frame / N=1 "
           "| conversation frames/s |")
    yield "|" + "---|" * 10
    for (quant, stage, prefill, kv), by_n in sorted(groups.items()):
        if 1 not in by_n:
            continue
        lm1 = median([lm for lm, _ in by_n[1]])
        frame1 = median([f for _, f in by_n[1]])
        cache = f"{prefill} positions {kv}" if prefill else "empty"
        for n in sorted(by_n):
            lm = median([lm for lm, _ in by_n[n]])
            frame = median([f for _, f in by_n[n]])
            yield (f"| {quant} | {stage} | {cache} | {n} | {len(by_n[n])} | {lm:.0f} | {lm / lm1:.2f} "
                   f"| {frame:.0f} | {frame / frame1:.2f} | {n * 1000 / frame:.1f} |")


def measured_rows(reports):
    yield ("| quant | layers run | Mimi enc | temporal | depformer | sampling | Mimi dec | frame p50 | frame p99 "
           "| RTF | LM GB read/frame | KV GB read/frame | read GB/s | LM bound ms | LM p50 ms | ratio to bound "
           "| peak mem GB |")
    yield "|" + "---|" * 17
    for r in reports:
        s, w, b, m = r["stages"], r["weights"], r["bound"], r["machine"]
        p = lambda k: s[k]["p50"]
        peak = m["peak_memory_bytes"]
        yield (f"| {label(r)} | {r['run']['layers_run']}/{r['run']['layers_config']} | {p('mimi_encode_ms'):.1f} "
               f"| {p('lm_temporal_ms'):.1f} | {p('lm_depformer_ms'):.1f} | {p('sampling_ms'):.2f} | {p('mimi_decode_ms'):.1f} "
               f"| {p('total_ms'):.1f} | {s['total_ms']['p99']:.1f} | {r['real_time_factor']:.2f} "
               f"| {w['read_per_frame_bytes'] / 1e9:.2f} | {w.get('kv_cache_read_per_frame_bytes', 0) / 1e9:.2f} "
               f"| {m['read_bandwidth_gbps']:.2f} | {b['lm_bound_ms']:.0f} "
               f"| {b['lm_measured_p50_ms']:.0f} | {b['ratio_to_bound']:.2f} | {'n/a' if peak is None else f'{peak / 1e9:.2f}'} |")


def extrapolated_rows(reports):
    yield ("| quant | per layer ms | temporal ms | LM step ms | frame ms | RTF | LM GB read/frame | KV GB read/frame "
           "| LM bound ms | ratio to bound | LM weights GB |")
    yield "|" + "---|" * 11
    for r in reports:
        x = r["extrapolated"]
        yield (f"| {label(r)} | {x['per_layer_p50_ms']:.1f} | {x['lm_temporal_p50_ms']:.0f} | {x['lm_step_p50_ms']:.0f} "
               f"| {x['total_p50_ms']:.0f} | {x['real_time_factor']:.1f} | {x['read_per_frame_bytes'] / 1e9:.2f} "
               f"| {x.get('kv_cache_read_per_frame_bytes', 0) / 1e9:.2f} "
               f"| {x['bound']['lm_bound_ms']:.0f} | {x['bound']['ratio_to_bound']:.2f} | {x['resident_bytes'] / 1e9:.2f} |")


def main(paths):
    if not paths:
        raise SystemExit(__doc__)
    reports = [load(p) for p in paths]
    print("\n".join(measured_rows(reports)))
    extrapolated = [r for r in reports if r.get("extrapolated")]
    if extrapolated:
        print()
        print(f"Extrapolated to {extrapolated[0]['extrapolated']['layers']} layers (not measured):")
        print()
        print("\n".join(extrapolated_rows(extrapolated)))
    if any(r["run"].get("sessions", 1) > 1 for r in reports):
        print()
        print("Sessions (full depth where extrapolated, not measured):")
        print()
        print("\n".join(sessions_rows(reports)))


if __name__ == "__main__":
    main(sys.argv[1:])
