"""Summarise bench/peers/sweep.sh: every llama-bench row as a table, and the best decode and the
best prefill configuration (highest mean tok/s) as summary.json beside the raw JSON."""
import json
import pathlib
import sys

# Older llama-bench builds report use_mmap and use_extra_bufts; newer ones load_mode and repack.
KNOBS = ("n_threads", "flash_attn", "use_mmap", "load_mode", "poll", "n_batch", "n_ubatch", "no_op_offload", "use_extra_bufts", "repack")


def rows(folder):
    for f in sorted(folder.glob("*.json")):
        if f.name == "summary.json":
            continue
        for r in json.loads(f.read_text() or "[]"):
            kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            yield f.stem, kind, r


FLAGS = {"flash_attn": "-fa", "use_mmap": "-mmp", "load_mode": "-lm", "poll": "--poll", "n_batch": "-b", "n_ubatch": "-ub", "use_extra_bufts": "-nr", "repack": "--repack"}


def flags(folder, key):
    """llama-bench flags of the best `key` ("decode" or "prefill") configuration (threads excluded:
    callers pass -t themselves)."""
    best = json.loads((pathlib.Path(folder) / "summary.json").read_text())[key]["knobs"]
    out = []
    for k, flag in FLAGS.items():
        if k in best and best[k] is not None:
            v = best[k]
            if k == "use_extra_bufts":  # -nr is "no repack": the inverse of use_extra_bufts
                v = not v
            if k == "flash_attn" and "load_mode" in best:  # newer builds: -fa on|off|auto, reported 1/0/-1
                v = {1: "on", 0: "off"}.get(v, "auto")
            out += [flag, str(int(v)) if isinstance(v, bool) else str(v)]
    return " ".join(out)


def main(folder):
    folder = pathlib.Path(folder)
    best = {}
    print("| group | test | " + " | ".join(KNOBS) + " | tok/s (mean ± sd) |")
    print("|---|---|" + "---|" * len(KNOBS) + "---:|")
    for group, kind, r in rows(folder):
        knobs = {k: r.get(k) for k in KNOBS if k in r}
        print(f"| {group} | {kind} | " + " | ".join(str(r.get(k, "")) for k in KNOBS) + f" | {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} |")
        key = "decode" if kind.startswith("tg") else "prefill"
        if key not in best or r["avg_ts"] > best[key]["avg_ts"]:
            best[key] = {"group": group, "test": kind, "avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"], "samples_ts": r.get("samples_ts"), "knobs": knobs}
    for key, b in best.items():
        print(f"\nbest {key}: {b['test']} {b['avg_ts']:.2f} tok/s with {b['knobs']} (group {b['group']})")
    (folder / "summary.json").write_text(json.dumps(best, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--flags":
        print(flags(sys.argv[1], sys.argv[3]))
    else:
        main(sys.argv[1])
