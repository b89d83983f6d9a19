#!/usr/bin/env python3
"""Fairness probe for `hostd serve` (issue 14, part E): how long a short request waits for its
first token while a long prompt is being prefilled.

For each run: start a long /v1/completions request (LONG token ids, max_tokens 1, distinct ids
per run so nothing is reused), wait until the scheduler has run a given share of its prefill
blocks (hostd_prefill_chunks_total; run i of N waits for (i + 0.5) / N of them, so the runs
sample early to late positions, where blocks cost more: attention grows with position), then
send a streaming request with a SHORT-token
prompt and max_tokens 4 and time, from its send: the first streamed token (TTFT) and its end.
Also records when the long request ended, so "the short one finished first" is observed, not
assumed. A solo run of each gives the baselines.

Standard library only. Usage:
  bench/serve_fairness.py [--bin target/release/hostd] [--model tests/fixtures/models/small]
                          [--chunk 512] [--long 12000] [--short 4] [--runs 5] [--out FILE.json]
Extra flags after `--` go to `hostd serve`.
"""

import argparse
import http.client
import json
import math
import os
import signal
import random
import statistics
import subprocess
import sys
import threading
import time


def post(addr, path, body, stream=False, timeout=600):
    host, port = addr
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def get(addr, path):
    host, port = addr
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def metric(addr, name):
    _, text = get(addr, "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def start_server(args, extra):
    cmd = [args.bin, "serve", "--model", args.model, "--port", "0", "--prefill-chunk", str(args.chunk),
           "--state-cache-bytes", "0", "--served-model-name", "probe"] + extra
    env = dict(os.environ, SLUICE_THREADS=str(args.threads))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    line = p.stdout.readline()
    hostport = line.strip().rsplit("http://", 1)[1]
    host, port = hostport.rsplit(":", 1)
    addr = (host, int(port))
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            if get(addr, "/health")[0] == 200:
                return p, addr
        except OSError:
            pass
        time.sleep(0.05)
    p.kill()
    sys.exit("server not ready within 120 s")


def long_request(addr, ids, result):
    t0 = time.monotonic()
    c, r = post(addr, "/v1/completions", {"model": "probe", "prompt": ids, "max_tokens": 1, "temperature": 0})
    body = r.read()
    result["status"] = r.status
    result["end"] = time.monotonic()
    result["elapsed_s"] = result["end"] - t0
    if r.status == 200:
        result["prompt_tokens"] = json.loads(body)["usage"]["prompt_tokens"]
    c.close()


def short_request(addr, ids):
    t0 = time.monotonic()
    body = {"model": "probe", "prompt": ids, "max_tokens": 4, "temperature": 0, "stream": True,
            "logprobs": 0, "ignore_eos": True}
    c, r = post(addr, "/v1/completions", body)
    assert r.status == 200, r.status
    ttft = None
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        if ttft is None:
            ttft = time.monotonic() - t0
    end = time.monotonic()
    c.close()
    return {"ttft_s": ttft, "e2e_s": end - t0, "end": end}


def ids_for(rng, n):
    return [rng.randrange(100, 600) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/hostd")
    ap.add_argument("--model", default="tests/fixtures/models/small")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--long", type=int, default=12000)
    ap.add_argument("--short", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args, extra = ap.parse_known_args()
    extra = [e for e in extra if e != "--"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    rng = random.Random(14)
    blocks = math.ceil(args.long / args.chunk)
    proc, addr = start_server(args, extra)
    report = {"bin": args.bin, "model": args.model, "prefill_chunk": args.chunk, "long_tokens": args.long,
              "short_tokens": args.short, "threads": args.threads, "serve_flags": extra,
              "loadavg_start": open("/proc/loadavg").read().strip(), "runs": []}
    try:
        # Solo baselines (after one warm-up request).
        short_request(addr, ids_for(rng, args.short))
        report["solo_short"] = short_request(addr, ids_for(rng, args.short))
        solo = {}
        long_request(addr, ids_for(rng, args.long), solo)
        report["solo_long_s"] = solo["elapsed_s"]
        for i in range(args.runs):
            res = {}
            before = metric(addr, "hostd_prefill_chunks_total")
            t = threading.Thread(target=long_request, args=(addr, ids_for(rng, args.long), res))
            t.start()
            at = max(1, int((i + 0.5) / args.runs * blocks))
            while metric(addr, "hostd_prefill_chunks_total") < before + at:
                time.sleep(0.005)
            s = short_request(addr, ids_for(rng, args.short))
            t.join()
            run = {"sent_after_blocks": at, "of_blocks": blocks, "short_ttft_s": s["ttft_s"], "short_e2e_s": s["e2e_s"], "long_s": res["elapsed_s"],
                   "long_status": res["status"], "short_finished_first": s["end"] < res["end"]}
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
    finally:
        proc.kill()
        proc.wait()
    ttfts = [r["short_ttft_s"] for r in report["runs"]]
    report["median_short_ttft_s"] = statistics.median(ttfts)
    report["max_short_ttft_s"] = max(ttfts)
    report["median_long_s"] = statistics.median(r["long_s"] for r in report["runs"])
    report["short_finished_first"] = sum(r["short_finished_first"] for r in report["runs"])
    report["loadavg_end"] = open("/proc/loadavg").read().strip()
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
