#!/usr/bin/env python3
"""Summarise a bench/longctx.sh run: medians of the attention-core A/B and the end-to-end runs,
the peak-RSS bound of issue 17 (dense weights + KV cache + DeltaNet state + 1 GiB), into
$OUT/summary.json and a markdown table on stdout.

Usage: bench/longctx_summary.py OUT_DIR [MODEL_DIR]  (MODEL_DIR defaults to the run's model_dir)
"""
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

GIB = 1 << 30


def attention(out: Path):
    cases = defaultdict(list)
    for line in (out / "attention.jsonl").read_text().splitlines():
        r = json.loads(line)
        value = r.get("prefill_s", r.get("decode_ms_per_step"))
        cases[(r["mode"], r["tokens"], r["kernel"])].append(value)
    rows = []
    for (mode, tokens) in sorted({(m, t) for (m, t, _) in cases}):
        tiled = cases.get((mode, tokens, "tiled"))
        naive = cases.get((mode, tokens, "naive"))
        row = {
            "mode": mode,
            "tokens": tokens,
            "unit": "s for the whole prompt" if mode == "prefill" else "ms per decode step",
            "tiled_median": statistics.median(tiled) if tiled else None,
            "tiled_runs": tiled,
            "naive_median": statistics.median(naive) if naive else None,
            "naive_runs": naive,
        }
        if tiled and naive:
            row["speedup"] = row["naive_median"] / row["tiled_median"]
        rows.append(row)
    return rows


def e2e(path: Path, inspect: dict):
    d = json.loads(path.read_text())
    c = d["configs"][0]
    s = c["summary"]
    med = lambda k: (s.get(k) or {}).get("median")
    tokens = d["prompt_tokens"] + d["new_tokens"]
    kv = inspect["runtime_kv_bytes_per_token"] * tokens
    state = inspect["runtime_linear_state_bytes_per_sequence"]
    dense = inspect["dense_bytes_bf16"]
    bound = dense + kv + state + GIB
    hwm = med("hostd_vm_hwm_bytes")
    # The bound must hold for every run, the drift check included: test the largest peak.
    peaks = [r["hostd_vm_hwm_bytes"] for r in c["runs"] + [d["drift_check"]["run"]] if r.get("hostd_vm_hwm_bytes")]
    hwm_max = max(peaks) if peaks else None
    return {
        "prompt_tokens": d["prompt_tokens"],
        "prefill_chunk": d["prefill_chunk"],
        "new_tokens": d["new_tokens"],
        "runs": [r.get("round") for r in c["runs"]],
        "config": c["name"],
        "flags": c["flags"],
        "ttft_s": med("ttft_s"),
        "prefill_tokens_per_s": med("prefill_tokens_per_s"),
        "decode_tokens_per_s_at_depth": med("decode_tokens_per_s"),
        "decode_attention_ms_per_token": med("phase_ms_per_token.attention"),
        "hostd_vm_hwm_bytes": hwm,
        "rss_bound_bytes": bound,
        "rss_bound_terms": {
            "dense_bytes_bf16": dense,
            "kv_cache_bytes": kv,
            "deltanet_state_bytes": state,
            "headroom": GIB,
        },
        "hostd_vm_hwm_bytes_max_incl_drift": hwm_max,
        "rss_within_bound": hwm_max is not None and hwm_max <= bound,
        "loadavg_before_runs": [r.get("loadavg_before") for r in c["runs"]],
    }


def main():
    out = Path(sys.argv[1])
    runs = {p.stem: p for p in sorted(out.glob("e2e-*.json"))}
    model = sys.argv[2] if len(sys.argv) > 2 else None
    if model is None and runs:
        model = json.loads(next(iter(runs.values())).read_text())["model_dir"]
    # The pinned copy the run used (bench/longctx.sh's BENCH_BIN), else this checkout's build.
    hostd = Path(os.environ.get("BENCH_BIN", "/tmp/sluice-longctx-bin")) / "hostd"
    if not hostd.exists():
        target = Path(os.environ.get("CARGO_TARGET_DIR", Path(__file__).resolve().parent.parent / "target"))
        hostd = target / "release/hostd"
    inspect = json.loads(subprocess.run(
        [str(hostd), "inspect", model, "--json"], check=True, capture_output=True, text=True).stdout) if model else None
    summary = {
        "what": "bench/longctx.sh: attention core tiled vs naive at the real head shape (16/2/256), "
                "fresh process per case; hostd bench end to end, resident INT8, medians of fresh processes",
        "attention_core": attention(out),
        "end_to_end": {k: e2e(p, inspect) for k, p in runs.items()},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

    print("| attention core | tokens | tiled | naive | naive ÷ tiled |")
    print("|---|---:|---:|---:|---:|")
    for r in summary["attention_core"]:
        unit = "s" if r["mode"] == "prefill" else "ms/step"
        naive = f"{r['naive_median']:.3f} {unit}" if r["naive_median"] is not None else "—"
        speed = f"{r['speedup']:.2f}×" if "speedup" in r else "—"
        print(f"| {r['mode']} | {r['tokens']} | {r['tiled_median']:.3f} {unit} | {naive} | {speed} |")
    print()
    print("| end to end | prompt | TTFT s | prefill tok/s | decode tok/s at depth | attention ms/token | peak RSS GiB | bound GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for k, r in summary["end_to_end"].items():
        print(f"| {r['config']} | {r['prompt_tokens']} | {r['ttft_s']:.1f} | {r['prefill_tokens_per_s']:.1f} | "
              f"{r['decode_tokens_per_s_at_depth']:.2f} | {r['decode_attention_ms_per_token']:.1f} | "
              f"{r['hostd_vm_hwm_bytes'] / GIB:.2f} (max {r['hostd_vm_hwm_bytes_max_incl_drift'] / GIB:.2f}) | {r['rss_bound_bytes'] / GIB:.2f} |")


if __name__ == "__main__":
    main()
