#!/usr/bin/env python3
"""Markdown tables (docs/performance.md) from `moshi-rs bench --json` reports.

    python3 scripts/bench_table.py bf16.json q8.json q4.json

Prints two tables (a run with classifier-free guidance is labelled with its coefficient): the measured run (p50 ms per stage, the bytes read per frame by the LM weights
and the temporal KV caches, the bandwidth bound over both and the ratio to it)
and, for reports run with --layers below the config's, the figures extrapolated to full depth.
Standard library only.
"""

import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    if report.get("schema_version") not in (1, 2):
        raise SystemExit(f"error: {path}: schema_version {report.get('schema_version')!r}, this script reads 1 and 2")
    return report


def label(report):
    """The weight format, with the guidance coefficient when the run had two LM rows."""
    run = report["run"]
    rows = run.get("lm_rows", 1)
    return run["quant"] if rows == 1 else f"{run['quant']} cfg {run['cfg_coef']:g}"


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


if __name__ == "__main__":
    main(sys.argv[1:])
