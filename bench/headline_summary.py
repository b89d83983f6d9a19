#!/usr/bin/env python3
"""Summarise one bench/headline.sh run: sluice's hostd-bench JSONs beside llama-bench's, each
ratio against issue 7's target, into OUT.json and OUT.md. Pure arithmetic over the inputs;
every figure names the field it came from."""
import argparse, json, os, statistics, subprocess, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import longctx_round  # noqa: E402  (bench/peers/longctx_round.py)


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


def strict_fraction(cfg, bench):
    """The median over a config's runs of its DRAM fraction re-divided by max(probe, the GB/s of
    the fastest op that streamed >= 100 MB of weights per decode token in that run's process);
    None when the runs carry no per-op profile."""
    if not cfg:
        return None
    probe = bench["bandwidth"]["dram_gbps_used"]
    vals = []
    for r in cfg.get("runs", []):
        dec = ((r.get("profile") or {}).get("decode") or {})
        ops, n = dec.get("ops") or {}, dec.get("tokens") or 0
        streams = [o["achieved_gbps"] for o in ops.values() if n and o.get("weight_bytes_total", 0) / n >= 100e6 and o.get("achieved_gbps")]
        if r.get("dram_fraction") is None or not streams:
            continue
        vals.append(r["dram_fraction"] * probe / max(probe, max(streams)))
    return statistics.median(vals) if vals else None


def longctx(d):
    """Round 1 of a bench/peers/longctx.sh folder (read by bench/peers/longctx_round.py): sluice's
    and llama.cpp's prefill and decode rates; None without a sluice run or a llama.cpp run."""
    x = longctx_round.read(d, 1)
    s = x and x["sluice"]
    if not s:
        return None
    return {"dir": d, "tokens": s["prefill"]["tokens"], "sluice_prefill": s["prefill"]["tokens_per_s"],
            "sluice_decode": s["decode"]["tokens_per_s"], "hostd_vm_hwm_bytes": ((s.get("process") or {}).get("hostd") or {}).get("vm_hwm_bytes"),
            "llama_prefill": x["llama_prefill"], "llama_decode": x["llama_decode"], "llama_tool": x["llama_tool"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--resident", required=True)
    ap.add_argument("--streaming", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--peer-bounded")
    ap.add_argument("--streaming-bounded")
    ap.add_argument("--limit-bytes", type=int)
    ap.add_argument("--longctx", action="append", default=[], help="a bench/peers/longctx.sh OUT folder (its round 1); repeatable")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", help="issue 38's run: sluice and llama.cpp on this same GGUF; configs q4k, q4k-expertd, dense-bf16; goals 1.3x decode, 1.5x prefill, 10x in the cgroup")
    a = ap.parse_args()
    res, st = json.load(open(a.resident)), json.load(open(a.streaming))
    cfg = {c["name"]: c for c in res["configs"]}
    stream = next(c for c in st["configs"] if c["name"] == "stream10")
    stb = json.load(open(a.streaming_bounded)) if a.streaming_bounded and os.path.exists(a.streaming_bounded) else None
    stream_b = next((c for c in stb["configs"] if c["name"] == "stream10"), None) if stb else None
    drift = {"resident": res.get("drift_check", {}).get("decode_deviation_from_first_config_median"),
             "streaming": st.get("drift_check", {}).get("decode_deviation_from_first_config_median"),
             "streaming_bounded": (stb or {}).get("drift_check", {}).get("decode_deviation_from_first_config_median")}
    # This VM's run-to-run noise: the drift checks of the first headline runs (2026-11-29) ranged
    # -9% .. +11% with nothing else running, so a bench that drifted more than 10% is not
    # judged, and a ratio within 10% of its goal is reported as "within noise", not met/unmet.
    DRIFT_LIMIT = 0.10
    NOISE = 0.10

    def drift_ok(which):
        d = drift.get(which)
        return d is not None and abs(d) <= DRIFT_LIMIT
    p, pb = peer(a.peer), peer(a.peer_bounded)
    tg = p.get("tg128", {}).get("avg_ts")
    pp = p.get("pp512", {}).get("avg_ts")
    tgb = next((v["avg_ts"] for k, v in pb.items() if k.startswith("tg")), None)

    def ratio(x, y):
        return None if x is None or not y else x / y

    rows = []

    def target(name, value, goal, what, benches):
        ok = all(drift_ok(b) for b in benches)
        met = None if value is None or not ok else value >= goal
        within_noise = value is not None and abs(value / goal - 1.0) < NOISE
        rows.append({"target": name, "value": value, "goal": goal, "met": met, "within_noise": within_noise, "drift_ok": ok, "what": what})

    if a.gguf:
        # Issue 38: the same GGUF on both sides.
        # dense-bf16 is not the exact mode (its experts are the container's): no bf16 lines.
        i8, bf, xd = cfg.get("q4k"), None, cfg.get("q4k-expertd")
        main_name, peer_name, goals = "q4k", f"llama.cpp on {a.gguf}", {"decode": 1.3, "prefill": 1.5, "bounded": 10.0}
        main_flags = "--dense int8 --experts int8 on the container prepared from the GGUF"
    else:
        i8, bf, xd = cfg.get("int8"), cfg.get("bf16"), cfg.get("int8-expertd")
        main_name, peer_name, goals = "int8", "llama.cpp Q8_0", {"decode": 1.2, "prefill": 1.5, "bounded": 3.0}
        main_flags = "--dense int8 --experts int8"
    # Goals: issue 17's (decode 1.2x, prefill 1.5x, roofline 0.85 / 0.80, cgroup 3x), issue 12's
    # 0.95; with --gguf issue 38's (1.3x, 1.5x, 10x).
    target(f"resident {main_name} decode / {peer_name} tg128", ratio(med(i8, "decode_tokens_per_s"), tg), goals["decode"],
           f"median decode tok/s of config {main_name} ({main_flags}, {res.get('new_tokens')} steps after a {res.get('prompt_tokens')}-token prompt) / llama-bench tg128 avg_ts", ["resident"])
    target(f"resident {main_name} decode, fraction of DRAM roofline", med(i8, "dram_fraction"), 0.85,
           "weight bytes per decode token x decode tok/s / DRAM read GB/s measured by the same bench (median over runs)", ["resident"])
    if bf is not None:
        target("resident bf16 (exact) decode, fraction of DRAM roofline", med(bf, "dram_fraction"), 0.80, "as above, config bf16", ["resident"])
    target(f"resident {main_name} decode, fraction of max(DRAM probe, its own fastest weight stream)", strict_fraction(i8, res), 0.85,
           f"as the {main_name} roofline line, but each run's denominator is the larger of the probe and the GB/s of the fastest op streaming >= 100 MB of weights per token in that process (the probe can read below what the kernels reach; median over runs)", ["resident"])
    if bf is not None:
        target("resident bf16 (exact) decode, fraction of max(DRAM probe, its own fastest weight stream)", strict_fraction(bf, res), 0.80, "as above, config bf16", ["resident"])
    target(f"prefill 512, {main_name} / {peer_name} pp512", ratio(med(i8, "prefill_tokens_per_s"), pp), goals["prefill"],
           "median prefill tok/s (512-token prompt in one block, excl. choosing the first token) / llama-bench pp512 avg_ts", ["resident"])
    if bf is not None:
        target("prefill 512, bf16 / llama.cpp pp512", ratio(med(bf, "prefill_tokens_per_s"), pp), 1.0, "as above, config bf16", ["resident"])
    target("streaming 10% cache, cold: disk bytes/s / O_DIRECT bandwidth", med(stream, "disk_fraction"), 0.80,
           "physical disk bytes per decode token (hostd + expertd /proc/<pid>/io read_bytes) x decode tok/s / O_DIRECT read GB/s of the container measured by the same bench", ["streaming"])
    target(f"streaming decode / {peer_name} decode, both inside the same cgroup memory limit", ratio(med(stream_b, "decode_tokens_per_s"), tgb), goals["bounded"],
           "median decode tok/s of config stream10 run inside the cgroup / llama-bench tg avg_ts inside a cgroup with the same limit; limit = sluice's median hostd + expertd peak RSS (VmHWM) in the unbounded streaming run", ["streaming_bounded"])
    target("decode through expertd / in-process", ratio(med(xd, "decode_tokens_per_s"), med(i8, "decode_tokens_per_s")), 0.95,
           f"median decode tok/s of config {main_name}-expertd / config {main_name}, same bench run", ["resident"])

    # Long context (issue 17): one round per length, sluice's `hostd profile` then llama.cpp's.
    longs = [lc for lc in (longctx(d) for d in a.longctx) if lc]
    for lc in longs:
        n = lc["tokens"]
        target(f"prefill {n}, int8 / llama.cpp", ratio(lc["sluice_prefill"], lc["llama_prefill"]), 1.0,
               f"one round ({lc['dir']}): sluice prefill tok/s ({n}-token prompt in blocks of 512) / llama.cpp's ({lc['llama_tool']}); one sample per side", [])
        target(f"decode at {n} depth, int8 / llama.cpp", ratio(lc["sluice_decode"], lc["llama_decode"]), 1.0,
               f"the same round: sluice decode tok/s after the prompt / llama.cpp's decode at that depth", [])

    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {
        "what": ("issue 38 targets: sluice and llama.cpp on the same GGUF " + a.gguf) if a.gguf else "issue 17 (and issue 12) targets from one bench/headline.sh run",
        "date": res.get("date"), "commit": res.get("commit"), "summarised_at_commit": commit, "cpu": res.get("cpu"),
        "threads": res.get("threads"), "cores": res.get("cores"),
        "dram_gbps": res["bandwidth"]["dram_gbps_used"], "streaming_bandwidth": st["bandwidth"],
        "llama_cpp": {"unbounded": p, "bounded": pb, "limit_bytes": a.limit_bytes},
        "sluice": {name: {k: v.get("median") for k, v in c["summary"].items() if isinstance(v, dict)} for name, c in list(cfg.items()) + [("stream10", stream)]},
        "drift": drift,
        "drift_limit": DRIFT_LIMIT,
        "cold_proven_runs": {"streaming": stream["summary"].get("cold_proven_runs"),
                             "streaming_bounded": (stream_b or {}).get("summary", {}).get("cold_proven_runs")},
        "long_context": longs,
        "targets": rows,
    }
    json.dump(out, open(a.out + ".json", "w"), indent=2)

    def f(v, d=2):
        return "—" if v is None else f"{v:.{d}f}"

    md = [f"# Headline numbers ({out['date']}, commit {out['commit']}, {out['cpu']}, {out['threads']} threads)", "",
          "| config | prefill tok/s (512) | TTFT s | decode tok/s | weights MB/token | DRAM fraction | disk MB/token | hostd RSS GiB | expertd RSS GiB |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in list(cfg.items()) + [("stream10 (cold)", stream), ("stream10 (cold, inside the cgroup)", stream_b)]:
        if c is None:
            continue
        def s(k, div=1.0):
            v = med(c, k)
            return None if v is None else v / div
        md.append(f"| {name} | {f(s('prefill_tokens_per_s'),1)} | {f(s('ttft_s'))} | {f(s('decode_tokens_per_s'))} | {f(s('weight_bytes_per_decode_token', 1e6),1)} | {f(s('dram_fraction'))} | {f(s('disk_bytes_per_decode_token', 1e6),1)} | {f(s('hostd_vm_hwm_bytes', 2**30))} | {f(s('expertd_vm_hwm_bytes', 2**30))} |")
    md.append(f"| {peer_name} | {f(pp,1)} (pp512) | — | {f(tg)} (tg128) | — | — | — | — | — |")
    if tgb is not None:
        md.append(f"| {peer_name}, cgroup {a.limit_bytes/2**30:.2f} GiB | — | — | {f(tgb)} | — | — | — | — | — |")
    if longs:
        md += ["", "| long context (one round each) | sluice prefill tok/s | llama.cpp prefill tok/s | sluice decode tok/s at depth | llama.cpp decode tok/s at depth | hostd peak RSS GiB |",
               "|---|---:|---:|---:|---:|---:|"]
        for lc in longs:
            rss = None if lc["hostd_vm_hwm_bytes"] is None else lc["hostd_vm_hwm_bytes"] / 2**30
            md.append(f"| {lc['tokens']} tokens ({lc['llama_tool']}) | {f(lc['sluice_prefill'],1)} | {f(lc['llama_prefill'],1)} | {f(lc['sluice_decode'])} | {f(lc['llama_decode'])} | {f(rss)} |")
    md += ["", f"Drift check (first config re-run at the end, decode vs its median): {drift}; a target whose bench drifted more than {DRIFT_LIMIT:.0%} is not judged.", "",
           "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for r in rows:
        verdict = "yes" if r["met"] else ("no" if r["met"] is False else ("not judged: drift" if not r["drift_ok"] and r["value"] is not None else "not measured"))
        if r["met"] is not None and r["within_noise"]:
            verdict += f" (within {NOISE:.0%} of the goal: not distinguishable on this machine)"
        md.append(f"| {r['target']} | {f(r['value'])} | {r['goal']} | {verdict} |")
    open(a.out + ".md", "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
