#!/usr/bin/env python3
"""Collects $WORK/raw/*.jsonl|json (default /tmp/expertd-bench) into docs/results/expertd.json."""
import json, os, statistics, subprocess, sys
W = os.environ.get("WORK", "/tmp/expertd-bench")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
jl = lambda p: [json.loads(l) for l in open(os.path.join(W, "raw", p)) if l.startswith("{")]
med = statistics.median
out = {
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
    "source_state": open(os.path.join(W, "bin/source-state.txt")).read(),
    "machine": sorted({l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")}),
    "cores": os.cpu_count(),
    "mem_total_kib": int([l for l in open("/proc/meminfo") if l.startswith("MemTotal")][0].split()[1]),
}
rtt = {}
for r in jl("rtt.jsonl"):
    k = f'{r["payload"]}/{r["transport"]}'
    rtt.setdefault(k, []).append(r["result"])
out["round_trip"] = {k: {"runs": v, "median_of_run_medians_us": med([x["median_us"] for x in v])} for k, v in rtt.items()}
dec = {}
for r in jl("decode.jsonl"):
    dec.setdefault(r["backend"], []).append(r)
out["decode"] = {k: {"runs": v, "median_decode_tokens_per_s": med([x["result"]["decode_tokens_per_s"] for x in v]),
                     "median_ttft_s": med([x["result"]["ttft_s"] for x in v])} for k, v in dec.items()}
if "int8" in dec and "expertd-shm" in dec:
    out["decode"]["ratio_expertd_over_int8"] = out["decode"]["expertd-shm"]["median_decode_tokens_per_s"] / out["decode"]["int8"]["median_decode_tokens_per_s"]
cache = []
for r in jl("cache.jsonl"):
    if "pct" not in r: cache.append(r); continue
    a, b, run = r["stats_before"], r["stats_after"], r["run"]
    steps = run["decode_steps"] + 1  # forward steps: 1 prefill block + decode steps
    d = {k: b[k] - a[k] for k in ("hits", "misses", "bytes_read", "evictions", "transient_uses")}
    d["physical_read_bytes"] = r["read_bytes_after"] - r["read_bytes_before"]
    r["delta"] = d
    r["per_forward_step"] = {k: v / steps for k, v in d.items()}
    r["per_generated_token"] = {k: v / run["new_tokens"] for k, v in d.items()}
    pct = r["pct"]
    try:
        r["trace_summary"] = json.load(open(os.path.join(W, "raw", f"trace-summary-{pct}.json")))
        r["replay"] = json.load(open(os.path.join(W, "raw", f"replay-{pct}.json")))
    except FileNotFoundError:
        pass
    cache.append(r)
out["cache"] = cache
p = os.path.join(W, "raw", "rss-realdim.json")
if os.path.exists(p):
    out["rss_realdim4"] = json.load(open(p))
json.dump(out, open(os.path.join(ROOT, "docs/results/expertd.json"), "w"), indent=1)
print(json.dumps({"rtt": {k: v["median_of_run_medians_us"] for k, v in out["round_trip"].items()},
                  "decode": {k: (v if isinstance(v, float) else v["median_decode_tokens_per_s"]) for k, v in out["decode"].items()}}, indent=1))
for r in cache:
    if "delta" in r:
        print(r["pct"], r["phase"], r["io"], r["delta"], {k: round(v) for k, v in r["per_forward_step"].items()}, r["run"]["decode_tokens_per_s"])
    else:
        print(r)
