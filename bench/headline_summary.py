#!/usr/bin/env python3
"""Summarise one bench/headline.sh run: sluice's hostd-bench JSONs beside llama-bench's, each
ratio against issue 7's target, into OUT.json and OUT.md. Pure arithmetic over the inputs;
every figure names the field it came from."""
import argparse, json, os, subprocess


def med(cfg, field):
    """The median of a summary field, or None when the config or the field has no value."""
    v = (cfg or {}).get("summary", {}).get(field)
    return v.get("median") if isinstance(v, dict) else None


def peer(path):
    if not path or not os.path.exists(path):
        return {}
    out = {}
    for r in json.load(open(path)):
        kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        out[kind] = {"avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"], "samples_ts": r.get("samples_ts"), "build_commit": r.get("build_commit")}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--resident", required=True)
    ap.add_argument("--streaming", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--peer-bounded")
    ap.add_argument("--limit-bytes", type=int)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res, st = json.load(open(a.resident)), json.load(open(a.streaming))
    cfg = {c["name"]: c for c in res["configs"]}
    stream = st["configs"][0]
    p, pb = peer(a.peer), peer(a.peer_bounded)
    tg = p.get("tg128", {}).get("avg_ts")
    pp = p.get("pp512", {}).get("avg_ts")
    tgb = next((v["avg_ts"] for k, v in pb.items() if k.startswith("tg")), None)

    def ratio(x, y):
        return None if x is None or not y else x / y

    rows = []

    def target(name, value, goal, what):
        rows.append({"target": name, "value": value, "goal": goal, "met": None if value is None else value >= goal, "what": what})

    i8, bf, xd = cfg.get("int8"), cfg.get("bf16"), cfg.get("int8-expertd")
    target("resident int8 decode / llama.cpp Q8_0 tg128", ratio(med(i8, "decode_tokens_per_s"), tg), 1.0,
           "median decode tok/s of config int8 (--dense int8 --experts int8, 128 steps after a 512-token prompt) / llama-bench tg128 avg_ts")
    target("resident int8 decode, fraction of DRAM roofline", med(i8, "dram_fraction"), 0.85,
           "weight bytes per decode token x decode tok/s / DRAM read GB/s measured by the same bench (median over runs)")
    target("resident bf16 (exact) decode, fraction of DRAM roofline", med(bf, "dram_fraction"), 0.80, "as above, config bf16")
    target("prefill 512, int8 / llama.cpp pp512", ratio(med(i8, "prefill_tokens_per_s"), pp), 1.0,
           "median prefill tok/s (512-token prompt in one block, excl. choosing the first token) / llama-bench pp512 avg_ts")
    target("prefill 512, bf16 / llama.cpp pp512", ratio(med(bf, "prefill_tokens_per_s"), pp), 1.0, "as above, config bf16")
    target("streaming 10% cache, cold: disk bytes/s / O_DIRECT bandwidth", med(stream, "disk_fraction"), 0.80,
           "physical disk bytes per decode token (hostd + expertd /proc/<pid>/io read_bytes) x decode tok/s / O_DIRECT read GB/s of the container measured by the same bench")
    target("streaming decode / llama.cpp decode under the same cgroup memory limit", ratio(med(stream, "decode_tokens_per_s"), tgb), 3.0,
           "median decode tok/s of config stream10 / llama-bench tg (bounded run) avg_ts; limit = sluice's median hostd + expertd peak RSS in that run")
    target("decode through expertd / in-process", ratio(med(xd, "decode_tokens_per_s"), med(i8, "decode_tokens_per_s")), 0.95,
           "median decode tok/s of config int8-expertd / config int8, same bench run")

    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {
        "what": "issue 7 targets from one bench/headline.sh run",
        "date": res.get("date"), "commit": res.get("commit"), "summarised_at_commit": commit, "cpu": res.get("cpu"),
        "threads": res.get("threads"), "cores": res.get("cores"),
        "dram_gbps": res["bandwidth"]["dram_gbps_used"], "streaming_bandwidth": st["bandwidth"],
        "llama_cpp": {"unbounded": p, "bounded": pb, "limit_bytes": a.limit_bytes},
        "sluice": {name: {k: v.get("median") for k, v in c["summary"].items() if isinstance(v, dict)} for name, c in list(cfg.items()) + [("stream10", stream)]},
        "drift": {"resident": res.get("drift_check", {}).get("decode_deviation_from_first_config_median"),
                  "streaming": st.get("drift_check", {}).get("decode_deviation_from_first_config_median")},
        "targets": rows,
    }
    json.dump(out, open(a.out + ".json", "w"), indent=2)

    def f(v, d=2):
        return "—" if v is None else f"{v:.{d}f}"

    md = [f"# Headline numbers ({out['date']}, commit {out['commit']}, {out['cpu']}, {out['threads']} threads)", "",
          "| config | prefill tok/s (512) | TTFT s | decode tok/s | weights MB/token | DRAM fraction | disk MB/token | hostd RSS GiB | expertd RSS GiB |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in list(cfg.items()) + [("stream10 (cold)", stream)]:
        def s(k, div=1.0):
            v = med(c, k)
            return None if v is None else v / div
        md.append(f"| {name} | {f(s('prefill_tokens_per_s'),1)} | {f(s('ttft_s'))} | {f(s('decode_tokens_per_s'))} | {f(s('weight_bytes_per_decode_token', 1e6),1)} | {f(s('dram_fraction'))} | {f(s('disk_bytes_per_decode_token', 1e6),1)} | {f(s('hostd_vm_hwm_bytes', 2**30))} | {f(s('expertd_vm_hwm_bytes', 2**30))} |")
    md.append(f"| llama.cpp Q8_0 | {f(pp,1)} (pp512) | — | {f(tg)} (tg128) | — | — | — | — | — |")
    if tgb is not None:
        md.append(f"| llama.cpp Q8_0, cgroup {a.limit_bytes/2**30:.2f} GiB | — | — | {f(tgb)} | — | — | — | — | — |")
    md += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for r in rows:
        md.append(f"| {r['target']} | {f(r['value'])} | {r['goal']} | {'yes' if r['met'] else ('no' if r['met'] is False else 'not measured')} |")
    open(a.out + ".md", "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
