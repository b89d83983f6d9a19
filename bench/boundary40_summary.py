#!/usr/bin/env python3
"""Summarises a bench/boundary40.sh run: reads $OUT/{rtt.jsonl,resident.json,streaming.json}
and writes $OUT/summary.json and prints a markdown table. Medians over fresh processes
(hostd bench summaries; for rtt, the median of the per-process p50s and the worst p99)."""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/boundary40")
rtt = [json.loads(line) for line in (out / "rtt.jsonl").read_text().splitlines() if line.strip()]
cells = {}
for r in rtt:
    key = (r["op"], r["transport"], r["top_k"])
    cells.setdefault(key, []).append(r)
summary = {"rtt": [], "resident": {}, "streaming": {}}
print("## Per-call round trip (hidden 2048, 1 row; 3 fresh client processes x 3000 timed calls)\n")
print("| op | transport | p50 µs (median of 3) | p99 µs (worst of 3) | per-process p50 |")
print("|---|---|---:|---:|---|")
for (op, transport, k), rs in cells.items():
    p50 = statistics.median(r["p50_us"] for r in rs)
    p99 = max(r["p99_us"] for r in rs)
    summary["rtt"].append({"op": op, "transport": transport, "top_k": k, "p50_us_median": p50, "p99_us_worst": p99, "runs": rs})
    label = f"{op}" + (f" top-{k}" if k else "")
    per = ", ".join("%.1f" % r["p50_us"] for r in rs)
    print(f"| {label} | {transport} | {p50:.1f} | {p99:.1f} | {per} |")


def med(c, k):
    v = c["summary"].get(k)
    return None if not v or v.get("median") is None else v["median"]


def table(name, keys):
    doc = json.loads((out / f"{name}.json").read_text())
    print(f"\n## {name} (commit {doc.get('commit')}, {doc.get('runs_per_config')} runs per config, cold={doc.get('cold')})\n")
    print("| config | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for c in doc["configs"]:
        row = {k: med(c, k) for k in keys}
        summary[name][c["name"]] = {"flags": c["flags"], "median": row, "cold_proven": [r.get("cold", {}).get("cold_proven") for r in c["runs"]]}
        print(f"| {c['name']} | " + " | ".join("–" if row[k] is None else f"{row[k]:.4g}" for k in keys) + " |")
    return doc


res = table("resident", ["decode_tokens_per_s", "expert_calls_per_token", "ipc_us_per_expert_call", "phase_ms_per_token.ipc", "phase_ms_per_token.routed_expert_compute", "phase_ms_per_token.wall", "hostd_vm_hwm_bytes", "expertd_vm_hwm_bytes"])
r = summary["resident"]
if "int8" in r and "expertd-ring" in r:
    base = r["int8"]["median"]["decode_tokens_per_s"]
    for name in ("expertd-ring", "expertd-old"):
        if name in r:
            r[name]["decode_ratio_vs_in_process"] = r[name]["median"]["decode_tokens_per_s"] / base
            print(f"\n{name} / int8 in-process decode: {r[name]['decode_ratio_vs_in_process']:.3f}")
st = table("streaming", ["decode_tokens_per_s", "disk_busy_fraction", "disk_fraction", "disk_bytes_per_decode_token", "hit_rate", "phase_ms_per_token.expert_io_wait", "prefetch_recall", "prefetch_wasted_bytes_per_token", "hostd_vm_hwm_bytes", "expertd_vm_hwm_bytes"])
summary["bandwidth"] = st.get("bandwidth")
# Paired rounds: the same round of each config ran back to back, so their ratio cancels most
# of the VM's drift; report every round's ratio beside the ratio of the medians.
runs = {c["name"]: {r["round"]: r for r in c["runs"]} for c in st["configs"]}
pairs = [("stream-ring-prefetch", "stream-ring"), ("stream-ring", "stream-old"), ("stream-ring-prefetch", "stream-old")]
print("\n| A / B, decode tok/s | per round | ratio of medians |\n|---|---|---:|")
for a, b in pairs:
    if a in runs and b in runs:
        per = [runs[a][k]["decode_tokens_per_s"] / runs[b][k]["decode_tokens_per_s"] for k in sorted(runs[a]) if k in runs[b]]
        ma = summary["streaming"][a]["median"]["decode_tokens_per_s"]
        mb = summary["streaming"][b]["median"]["decode_tokens_per_s"]
        summary["streaming"].setdefault("paired", []).append({"a": a, "b": b, "per_round": per, "ratio_of_medians": ma / mb})
        print(f"| {a} / {b} | " + ", ".join(f"{x:.3f}" for x in per) + f" | {ma / mb:.3f} |")
(out / "summary.json").write_text(json.dumps(summary, indent=1))
