"""Compares hostd plan's predicted decode tok/s with what hostd bench measured (run.sh's output):
writes plan40.json beside the inputs and prints a Markdown table."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
plans = {k: json.loads((out / f"plan-{k}.json").read_text()) for k in ("resident", "streaming")}
benches = {k: json.loads((out / f"{k}.json").read_text()) for k in ("resident", "streaming")}
# bench config name -> (which plan, format, routing model that applies to random weights)
pairs = {
    "int8": ("resident", "int8", "trained"),
    "q4k": ("resident", "q4k", "trained"),
    "q4k-stream": ("streaming", "q4k", "no-locality"),
    "int8-stream": ("streaming", "int8", "no-locality"),
}
def f_container(facts, fmt):
    return next(x["container_bytes"] for x in facts["formats"] if x["format"] == fmt)


rows = []
for bench_name, bench in benches.items():
    for c in bench["configs"]:
        plan_name, fmt, routing = pairs[c["name"]]
        plan = plans[plan_name]
        f = next(f for f in plan["formats"] if f["format"] == fmt)
        # a resident row has one entry ("resident"; "trained" in plans before f102df9)
        i = 0 if f["mode"] == "resident" else next(
            i for i, h in enumerate(f["hit_rates"]) if h["routing"] == routing)
        pred = f["decode_tok_s"][i]
        s = c["summary"]
        measured = s["decode_tokens_per_s"]["median"]
        disk = (s.get("disk_bytes_per_decode_token") or {}).get("median")
        # hostd's memory for the bench's context (prompt + new tokens), as the plan computes it
        # for its own --context; expertd's: the cache plus its overhead (streaming only).
        facts = plan["facts"]
        context = bench["prompt_tokens"] + bench["new_tokens"]
        # (a plan from before f102df9 has no host_runtime_bytes: no memory figures then). In
        # process, resident, hostd also maps the whole container.
        host = None
        if "host_runtime_bytes" in plan:
            host = (facts["dense_resident_bytes"] + facts["kv_bytes_per_token"] * context
                    + facts["linear_state_bytes"] + plan["host_runtime_bytes"]
                    + (f_container(facts, fmt) if f["mode"] == "resident" else 0))
        expertd = (f["cache_bytes"] + plan["expertd_overhead_bytes"][fmt]
                   if f["mode"] == "streaming" and "expertd_overhead_bytes" in plan else None)
        rows.append({
            "config": c["name"],
            "flags": c["flags"],
            "plan_mode": f["mode"],
            "plan_cache_bytes": f["cache_bytes"],
            "plan_hit_rate": f["hit_rates"][i]["decode_hit_rate"],
            "plan_disk_bytes_per_token": f["disk_bytes_per_token"][i],
            "plan_dram_gbps": plan["machine"]["dram_gbps"],
            "plan_disk_gbps": plan["machine"]["disk"]["gbps"],
            "predicted_tok_s": pred,
            "measured_decode_tok_s": s["decode_tokens_per_s"],
            "measured_disk_bytes_per_decode_token": disk,
            "error": pred["point"] / measured - 1.0,
            "plan_hostd_bytes_at_bench_context": host,
            "measured_hostd_vm_hwm_bytes": s["hostd_vm_hwm_bytes"]["median"],
            "plan_expertd_bytes": expertd,
            "measured_expertd_vm_hwm_bytes": (s.get("expertd_vm_hwm_bytes") or {}).get("median"),
            "measured_in_range": pred["low"] <= measured <= pred["high"],
        })
doc = {
    "what": "hostd plan's decode tok/s prediction (point and range) against hostd bench's median of 3 fresh processes, error = predicted point / measured - 1; and its memory figures (hostd at the bench's context, plus the mapped container when resident; expertd = cache + its overhead) against the peak RSS (VmHWM) the bench measured",
    "rows": rows,
}
(out / "plan40.json").write_text(json.dumps(doc, indent=1) + "\n")
print("| config | plan | predicted tok/s (range) | measured median [min–max] | error | in range | hostd GiB plan / peak RSS | expertd GiB plan / peak RSS |")
print("|---|---|---:|---:|---:|---|---:|---:|")
for r in rows:
    p, m = r["predicted_tok_s"], r["measured_decode_tok_s"]
    mode = r["plan_mode"]
    if mode == "streaming":
        mode += f", cache {r['plan_cache_bytes'] / 2**20:.0f} MiB, hit {100 * r['plan_hit_rate']:.0f}%"
    print(f"| {r['config']} | {mode} | {p['point']:.2f} ({p['low']:.2f}–{p['high']:.2f}) | "
          f"{m['median']:.2f} [{m['min']:.2f}–{m['max']:.2f}] | {100 * r['error']:+.0f}% | "
          f"{'yes' if r['measured_in_range'] else 'no'} | "
          + (f"{r['plan_hostd_bytes_at_bench_context'] / 2**30:.2f} / {r['measured_hostd_vm_hwm_bytes'] / 2**30:.2f} | "
             if r["plan_hostd_bytes_at_bench_context"] is not None else "– | ")
          + (f"{r['plan_expertd_bytes'] / 2**30:.2f} / {r['measured_expertd_vm_hwm_bytes'] / 2**30:.2f} |"
             if r["plan_expertd_bytes"] is not None else "– |"))
