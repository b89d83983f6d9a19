#!/usr/bin/env python3
"""The resident boundary ratio with the VM's noise in the identical-code phases taken out: per
round, CONFIG's decode time per token with its non-MoE phases (attention, DeltaNet, router,
lm_head, sampling, other: the same code in both configs) replaced by REFERENCE's from the same
round, i.e. REFERENCE wall - REFERENCE MoE + CONFIG MoE, where MoE = shared expert + routed
compute + expert IO wait + expert queue + IPC. Prints the geometric mean of REFERENCE wall /
adjusted wall over the rounds with its 95% t interval, and the median MoE ms per token of each.

usage: bench/moe_adjusted.py BENCH.json[,BENCH2.json,…] [CONFIG] [REFERENCE]   (defaults: ring int8;
several comma-separated JSONs are pooled as in paired_rounds.py)
"""
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paired_rounds import load_pooled, round_key, t95  # noqa: E402

MOE = ["shared_expert", "routed_expert_compute", "expert_io_wait", "expert_queue", "ipc"]
# The router runs the same code in both configs but measured +0.24 ms/token on the ring in
# nearly every round of runs 12-13: `--router-as-moe` counts it on the MoE side too.


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    d = load_pooled(sys.argv[1])
    args = [a for a in sys.argv[2:] if a != "--router-as-moe"]
    moe = MOE + ["router"] if "--router-as-moe" in sys.argv else MOE
    name = args[0] if args else "ring"
    ref = args[1] if len(args) > 1 else "int8"
    runs = {c["name"]: {r["round"]: r for r in c["runs"] if r.get("round") != "drift"} for c in d["configs"]}
    for n in (name, ref):
        if n not in runs:
            sys.exit(f"no config {n!r} in {sys.argv[1]} (have {', '.join(runs)})")
    ratios, moe_c, moe_r = [], [], []
    for k in sorted(set(runs[name]) & set(runs[ref]), key=round_key):
        c, r = runs[name][k]["decode_phases_ms_per_token"], runs[ref][k]["decode_phases_ms_per_token"]
        mc, mr = sum(c.get(p, 0.0) for p in moe), sum(r.get(p, 0.0) for p in moe)
        ratios.append(r["wall"] / (r["wall"] - mr + mc))
        moe_c.append(mc)
        moe_r.append(mr)
    if len(ratios) < 2:
        sys.exit("fewer than two paired rounds")
    logs = [math.log(x) for x in ratios]
    m = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    print(f"{name} / {ref}, non-MoE phases taken from {ref}{' (router counted as MoE)' if moe != MOE else ''}: {len(ratios)} rounds, geometric mean "
          f"{math.exp(m):.3f}, 95% interval {math.exp(m - half):.3f}-{math.exp(m + half):.3f}")
    print(f"MoE ms per token, medians: {name} {statistics.median(moe_c):.2f}, {ref} {statistics.median(moe_r):.2f}")


if __name__ == "__main__":
    main()
