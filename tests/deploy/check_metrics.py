"""Checks expertd's Prometheus text (argv[1], a file) with prometheus_client's standard parser:
per-session counters add up to their peer's counters and the peers' to the daemon totals.

  --all-open      no session has closed yet: each peer's counters equal the sum over its open
                  sessions (otherwise a peer's counters are at least that sum: closed sessions
                  stay in them).
  --no-prefetch   the daemon ran with --no-prefetch: the cache's own hits, misses and bytes read
                  equal the clients' totals.
  --expect-peers  comma-separated peer labels that must appear (e.g. uid:0,uid:65534).

Prints one JSON line with the totals; exits non-zero naming the first sum that does not add up.
"""

import json
import sys
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ["calls", "failed_calls", "hits", "misses", "read_bytes"]


def main() -> int:
    args = sys.argv[1:]
    text = open(args[0], encoding="utf-8").read()
    all_open = "--all-open" in args
    no_prefetch = "--no-prefetch" in args
    expect = []
    if "--expect-peers" in args:
        expect = args[args.index("--expect-peers") + 1].split(",")
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))

    def one(name):
        got = samples.get(name)
        if not got or len(got) != 1:
            raise SystemExit(f"{name}: expected exactly one sample, got {got!r}")
        return got[0][1]

    problems = []
    peers = {labels["peer"] for labels, _ in samples.get("expertd_peer_calls_total", [])}
    for p in expect:
        if p not in peers:
            problems.append(f"peer {p} missing (peers: {sorted(peers)})")
    n_sessions = len(samples.get("expertd_session_calls_total", []))
    for c in COUNTERS:
        by_peer = defaultdict(float)
        for labels, v in samples.get(f"expertd_session_{c}_total", []):
            by_peer[labels["peer"]] += v
        peer_vals = {labels["peer"]: v for labels, v in samples.get(f"expertd_peer_{c}_total", [])}
        for p, v in by_peer.items():
            if p not in peer_vals:
                problems.append(f"{c}: sessions of {p} but no expertd_peer_{c}_total for it")
            elif all_open and v != peer_vals[p]:
                problems.append(f"{c}: sessions of {p} sum to {v}, its peer counter says {peer_vals[p]}")
            elif v > peer_vals[p]:
                problems.append(f"{c}: sessions of {p} sum to {v}, more than its peer counter {peer_vals[p]}")
        total = one(f"expertd_{c}_total")
        if sum(peer_vals.values()) != total:
            problems.append(f"{c}: peers sum to {sum(peer_vals.values())}, the daemon total says {total}")
        if all_open and sum(by_peer.values()) != total:
            problems.append(f"{c}: sessions sum to {sum(by_peer.values())}, the daemon total says {total}")
    leases = sum(v for _, v in samples.get("expertd_session_leases_held", []))
    if all_open and leases != one("expertd_cache_leases_held"):
        problems.append(f"leases: sessions hold {leases}, the cache says {one('expertd_cache_leases_held')}")
    if no_prefetch:
        for mine, cache in [("hits", "cache_hits"), ("misses", "cache_misses"), ("read_bytes", "cache_read_bytes")]:
            if one(f"expertd_{mine}_total") != one(f"expertd_{cache}_total"):
                problems.append(f"{mine}: clients' total {one(f'expertd_{mine}_total')} != cache's {one(f'expertd_{cache}_total')}")
    if one("expertd_calls_total") <= 0:
        problems.append("no calls counted at all")
    summary = {c: one(f"expertd_{c}_total") for c in COUNTERS}
    summary.update(peers=sorted(peers), open_sessions=n_sessions)
    print(json.dumps(summary))
    for p in problems:
        print(f"check_metrics: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
