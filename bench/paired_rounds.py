#!/usr/bin/env python3
"""Paired per-round ratios of a `hostd bench` JSON: each config's decode tok/s divided by the
reference config's in the same round (runs interleave, so a round's configs ran minutes apart),
their median, geometric mean and the 95% t interval of the geometric mean (on the log ratios).

usage: bench/paired_rounds.py BENCH.json[,BENCH2.json,…] [REFERENCE_CONFIG] [--field decode_tokens_per_s] [--json]
Several comma-separated JSONs (runs of the same configs) are pooled, each one's rounds kept
apart ("2:5" is round 5 of the second file). The reference defaults to the first config. The drift run is left out; rounds a config lacks
(a failed run) are left out of that config's pairs.
"""
import argparse
import json
import math
import statistics
import sys

# Two-sided 95% quantiles of Student's t, by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
       18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t95(df):
    """The quantile for `df`, interpolated in 1/df between the table's entries (exact at them)."""
    if df < 1:
        return float("nan")
    if df in T95:
        return T95[df]
    lo = max(k for k in T95 if k < df)
    hi = [k for k in T95 if k > df]
    if not hi:
        return T95[lo]
    hi = min(hi)
    w = (1 / lo - 1 / df) / (1 / lo - 1 / hi)
    return T95[lo] + w * (T95[hi] - T95[lo])


def by_round(config, field):
    out = {}
    for r in config["runs"]:
        v = r.get(field)
        if r.get("round") not in (None, "drift") and isinstance(v, (int, float)) and v > 0:
            out[r["round"]] = v
    return out


def round_key(r):
    """Rounds are strings ("1", "2", …, "2:1" for a pooled second file): in numeric order."""
    f, _, n = str(r).rpartition(":")
    f = int(f) if f.isdigit() else 1
    return (0, f, int(n)) if n.isdigit() else (1, f, str(r))


def paired(values, ref):
    rounds = sorted(set(values) & set(ref), key=round_key)
    ratios = [values[k] / ref[k] for k in rounds]
    logs = [math.log(x) for x in ratios]
    res = {"rounds": rounds, "ratios": ratios}
    if ratios:
        m = statistics.fmean(logs)
        res["median"] = statistics.median(ratios)
        res["geometric_mean"] = math.exp(m)
    if len(ratios) >= 2:
        half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        res["geometric_mean_95"] = [math.exp(m - half), math.exp(m + half)]
    return res


def ran_first(schedule, name, ref_name):
    """Per round, whether `name` ran before `ref_name` in it (from the JSON's `schedule`)."""
    pos = {entry: i for i, entry in enumerate(schedule or [])}
    out = {}
    for entry, i in pos.items():
        n, _, r = entry.rpartition("#")
        if n == name and f"{ref_name}#{r}" in pos:
            out[r] = i < pos[f"{ref_name}#{r}"]
    return out


def by_order(p, first):
    """The paired geometric mean split by which of the two ran first in the round (an order
    effect shows as two different values)."""
    out = {}
    for label, want in (("ran_first", True), ("ran_second", False)):
        logs = [math.log(x) for k, x in zip(p["rounds"], p["ratios"]) if first.get(k) == want]
        if logs:
            out[label] = {"rounds": len(logs), "geometric_mean": math.exp(statistics.fmean(logs))}
    return out


def load_pooled(paths):
    """One bench JSON, or several (comma-separated) pooled: rounds and schedule entries of the
    n-th file after the first are labelled "n:ROUND"."""
    files = paths.split(",")
    d = json.load(open(files[0]))
    for n, f in enumerate(files[1:], start=2):
        e = json.load(open(f))
        by_name = {c["name"]: c for c in d["configs"]}
        for c in e["configs"]:
            if c["name"] not in by_name:
                sys.exit(f"{f}: config {c['name']!r} is not in {files[0]}")
            for r in c["runs"]:
                if r.get("round") not in (None, "drift"):
                    by_name[c["name"]]["runs"].append(dict(r, round=f"{n}:{r['round']}"))
        for entry in e.get("schedule") or []:
            name, _, r = entry.rpartition("#")
            if r != "drift":
                d.setdefault("schedule", []).append(f"{name}#{n}:{r}")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json")
    ap.add_argument("reference", nargs="?")
    ap.add_argument("--field", default="decode_tokens_per_s")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = ap.parse_args()
    d = load_pooled(a.bench_json)
    configs = {c["name"]: by_round(c, a.field) for c in d["configs"]}
    ref_name = a.reference or d["configs"][0]["name"]
    if ref_name not in configs:
        sys.exit(f"no config {ref_name!r} in {a.bench_json} (have {', '.join(configs)})")
    ref = configs[ref_name]
    summary = {"field": a.field, "reference": ref_name, "configs": {}}
    for name, values in configs.items():
        s = {"median": statistics.median(values.values()) if values else None, "by_round": values}
        if name != ref_name:
            s["vs_reference"] = paired(values, ref)
            s["vs_reference"]["by_order"] = by_order(s["vs_reference"], ran_first(d.get("schedule"), name, ref_name))
        summary["configs"][name] = s
    if a.json:
        print(json.dumps(summary, indent=1))
        return
    for name, s in summary["configs"].items():
        vals = ", ".join(f"{s['by_round'][k]:.2f}" for k in sorted(s["by_round"], key=round_key))
        print(f"{name}: {a.field} by round [{vals}], median {s['median']:.3f}")
    for name, s in summary["configs"].items():
        p = s.get("vs_reference")
        if not p or not p["ratios"]:
            continue
        ci = p.get("geometric_mean_95")
        ci_s = f", 95% interval {ci[0]:.3f}-{ci[1]:.3f}" if ci else ""
        print(f"{name} / {ref_name}: {len(p['ratios'])} rounds, per round "
              f"[{', '.join(f'{x:.3f}' for x in p['ratios'])}], median {p['median']:.3f}, "
              f"geometric mean {p['geometric_mean']:.3f}{ci_s}")
        for label, o in p.get("by_order", {}).items():
            print(f"  {label.replace('_', ' ')} in its round: {o['rounds']} rounds, geometric mean {o['geometric_mean']:.3f}")


if __name__ == "__main__":
    main()
