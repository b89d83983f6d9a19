#!/usr/bin/env python3
"""Summarises bench/peers/paired.sh: per round, sluice's decode and prefill tok/s (hostd profile
JSON) against llama-bench's tg and pp of the same round; the median and the geometric mean of the
per-round ratios with a 95% t interval on the log ratios. Writes summary.json beside the inputs."""
import json
import math
import statistics
import sys
from pathlib import Path

# Two-sided 95% Student t quantiles by degrees of freedom (n − 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 19: 2.093, 24: 2.064, 29: 2.045}


def t95(df):
    best = max(k for k in T95 if k <= df)
    return T95[best]


def paired(ratios):
    logs = [math.log(r) for r in ratios]
    g = math.exp(statistics.mean(logs))
    if len(logs) < 2:
        return {"geometric_mean": g, "ci95": None, "median": statistics.median(ratios)}
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"geometric_mean": g, "ci95": [g * math.exp(-half), g * math.exp(half)], "median": statistics.median(ratios)}


def main():
    out = Path(sys.argv[1])
    rounds = []
    r = 1
    while (out / f"sluice-{r}.json").exists() and (out / f"llama-{r}.json").exists():
        try:
            s = json.loads((out / f"sluice-{r}.json").read_text())
            rows = json.loads((out / f"llama-{r}.json").read_text())
        except json.JSONDecodeError:
            break  # a round still being written (or cut short): summarise the complete ones
        tg = next(x["avg_ts"] for x in rows if x["n_prompt"] == 0 and x["n_gen"] > 0)
        pp = next(x["avg_ts"] for x in rows if x["n_prompt"] > 0 and x["n_gen"] == 0)
        rounds.append({"round": r, "sluice_decode": s["decode_tokens_per_s"], "llama_tg": tg,
                       "sluice_prefill": s["prefill_tokens_per_s"], "llama_pp": pp})
        r += 1
    if not rounds:
        sys.exit(f"{out}: no complete round")
    dec = [x["sluice_decode"] / x["llama_tg"] for x in rounds]
    pre = [x["sluice_prefill"] / x["llama_pp"] for x in rounds]
    summary = {
        "what": "per round: one fresh hostd profile process (resident INT8 dense + experts, 512-token prompt, then decode) "
                "and, right after it, one llama-bench process (pp512 and tg from an empty context, 1 repetition); "
                "ratios are sluice / llama.cpp per round",
        "rounds": rounds,
        "decode_ratio": paired(dec),
        "prefill_ratio": paired(pre),
        "sluice_decode_median": statistics.median(x["sluice_decode"] for x in rounds),
        "llama_tg_median": statistics.median(x["llama_tg"] for x in rounds),
        "sluice_prefill_median": statistics.median(x["sluice_prefill"] for x in rounds),
        "llama_pp_median": statistics.median(x["llama_pp"] for x in rounds),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("| round | sluice decode | llama.cpp tg | ratio | sluice prefill | llama.cpp pp512 | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for x, d, p in zip(rounds, dec, pre):
        print(f"| {x['round']} | {x['sluice_decode']:.2f} | {x['llama_tg']:.2f} | {d:.2f} | {x['sluice_prefill']:.1f} | {x['llama_pp']:.1f} | {p:.2f} |")
    for name, key in (("decode", "decode_ratio"), ("prefill", "prefill_ratio")):
        s = summary[key]
        ci = f", 95% interval {s['ci95'][0]:.2f}-{s['ci95'][1]:.2f}" if s["ci95"] else ""
        print(f"\n{name}: median ratio {s['median']:.2f}, geometric mean {s['geometric_mean']:.2f}{ci}")


if __name__ == "__main__":
    main()
