#!/usr/bin/env python3
"""Per-session summary of an expertd route trace (docs/route-trace.md): for each session,
the prefill step (its first step: the whole prompt in one forward block) and the decode steps
separately — calls, lookups, hits, misses, transient uses, and misses × slot_bytes.
usage: trace_summary.py TRACE  → one JSON object on stdout."""
import json, sys
from collections import defaultdict

hdr, sess = None, defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
first_step = {}
for line in open(sys.argv[1]):
    ev = json.loads(line)
    if ev["ev"] == "header":
        hdr = ev
    elif ev["ev"] == "acquire" and not ev.get("exhausted"):
        s, st = ev["session"], ev["step"]
        first_step.setdefault(s, st)
        part = "prefill" if st == first_step[s] else "decode"
        d = sess[s][part]
        d["calls"] += 1
        d["lookups"] += len(ev["experts"])
        d["hits"] += ev["hits"]
        d["misses"] += ev["misses"]
        d["transient"] += ev.get("transient", 0)
        d["evictions"] += ev.get("evictions", 0)
        sess[s][part + "_steps"].setdefault(st, 0)
out = {"header": hdr, "sessions": {}}
for s, parts in sorted(sess.items()):
    o = {}
    for part in ("prefill", "decode"):
        d = dict(parts[part])
        steps = len(parts[part + "_steps"])
        d["steps"] = steps
        d["bytes_read"] = d.get("misses", 0) * hdr["slot_bytes"]
        if steps:
            d["misses_per_step"] = d.get("misses", 0) / steps
            d["bytes_per_step"] = d["bytes_read"] / steps
        o[part] = d
    out["sessions"][str(s)] = o
print(json.dumps(out))
