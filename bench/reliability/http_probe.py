#!/usr/bin/env python3
"""Fault probe of `hostd serve`'s HTTP layer (issue 14, part A): starts one server per
scenario on a free port and measures what a hostile or careless peer costs it.

Scenarios (each on a fresh server, the `tiny` fixture by default):
  burst_4mb       8 concurrent chat requests with a 4,000,000-byte message: statuses, the time
                  of each refusal, hostd's RSS peak over its idle RSS (VmRSS sampled every
                  10 ms) and after, and /health latency (a request every 10 ms; each has a
                  30 s limit, a failure is counted) throughout.
  burst_under_cap 8 concurrent chat requests with 1,000,000 bytes of ordinary text (just under
                  the 1 MiB prompt cap): what the admitted worst case costs (tokenisation runs).
  half_open_500   500 connections that send a partial request head, then nothing: time until
                  the server has closed all of them (limit 60 s), /health latency and one chat
                  request meanwhile.
  half_close      a request whose client shuts its write side after sending: response or not.
  slow_body       a body that stops after 8 of 100 declared bytes: status and time.

Usage: http_probe.py --hostd target/release/hostd --out docs/results/reliability/http.json
       [--label after] [--flags "--header-timeout 2 --body-timeout 5"] [--model DIR]
The JSON is one object per scenario; --flags go to every server (omit them for a binary
that predates them, to measure the baseline). Stdlib only.
"""
import argparse
import json
import os
import socket
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def chat_body(content, max_tokens=1):
    return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}).encode()


class Server:
    def __init__(self, hostd, model, flags):
        self.p = subprocess.Popen(
            [hostd, "serve", "--model", model, "--port", "0", "--served-model-name", "tiny"] + flags,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ, SLUICE_THREADS="2"))
        line = self.p.stdout.readline().decode()
        host, port = line.strip().rsplit("http://", 1)[1].rsplit(":", 1)
        self.addr = (host, int(port))
        deadline = time.time() + 60
        while self.get("/health")[0] != 200:
            if time.time() > deadline:
                raise SystemExit("server not ready in 60 s")
            time.sleep(0.05)

    def close(self):
        self.p.kill()
        self.p.wait()

    def exchange(self, raw, body=b"", half_close=False, timeout=60):
        s = socket.create_connection(self.addr, timeout=10)
        s.settimeout(timeout)
        data = b""
        try:
            s.sendall(raw)
            if body:
                try:
                    s.sendall(body)
                except OSError:
                    pass  # a refused body may stop being read; the reply should still come
            if half_close:
                s.shutdown(socket.SHUT_WR)
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError as e:
            if not data:
                return None, str(e)
        finally:
            s.close()
        head, _, rest = data.partition(b"\r\n\r\n")
        if not head:
            return None, "no response"
        return int(head.split(b" ")[1]), rest.decode(errors="replace")

    def get(self, path, timeout=30):
        try:
            return self.exchange(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), timeout=timeout)
        except OSError as e:
            return None, str(e)

    def post_chat(self, content, max_tokens=1, timeout=120):
        body = content if isinstance(content, bytes) else chat_body(content, max_tokens)
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        return self.exchange(head.encode(), body, timeout=timeout)


class Watch:
    """Polls /health and samples RSS every 10 ms until stopped."""

    def __init__(self, srv):
        self.srv, self.stop, self.lat, self.fail, self.peak = srv, threading.Event(), [], 0, 0
        self.t = threading.Thread(target=self.run)
        self.r = threading.Thread(target=self.sample)
        self.t.start()
        self.r.start()

    def run(self):
        while not self.stop.is_set():
            t = time.perf_counter()
            status, _ = self.srv.get("/health", timeout=30)
            self.lat.append(time.perf_counter() - t)
            self.fail += status != 200
            time.sleep(0.01)

    def sample(self):
        # Its own thread, so a stalled /health does not stall the RSS samples.
        while not self.stop.is_set():
            self.peak = max(self.peak, rss(self.srv.p.pid))
            time.sleep(0.01)

    def done(self):
        self.stop.set()
        self.t.join()
        self.r.join()
        lat = sorted(self.lat)
        return {"health_polls": len(lat), "health_failures": self.fail,
                "health_max_ms": round(1000 * lat[-1], 1) if lat else None,
                "health_p50_ms": round(1000 * lat[len(lat) // 2], 1) if lat else None}


def burst(srv, content, n=8):
    # The body is built before the clock starts (building it holds Python's GIL, which would
    # delay the /health poller and show up as server latency).
    content = chat_body(content)
    base = rss(srv.p.pid)
    w = Watch(srv)
    time.sleep(0.2)
    results = [None] * n

    def one(i):
        t = time.perf_counter()
        status, body = srv.post_chat(content, timeout=300)
        try:
            code = json.loads(body)["error"]["code"]
        except Exception:
            code = None
        results[i] = {"status": status, "code": code, "s": round(time.perf_counter() - t, 3)}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    time.sleep(0.3)
    out = w.done()
    out.update({"requests": results, "wall_s": round(wall, 3), "rss_idle_mb": round(base / 2**20, 1),
                "rss_peak_delta_mb": round((max(w.peak, base) - base) / 2**20, 1),
                "rss_after_delta_mb": round((rss(srv.p.pid) - base) / 2**20, 1)})
    return out


def half_open(srv, n=500, limit=60):
    socks = []
    for _ in range(n):
        s = socket.create_connection(srv.addr, timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(s)
    t0 = time.perf_counter()
    w = Watch(srv)
    chat_status, _ = srv.post_chat("hello", max_tokens=3)
    closed_at = []
    for s in socks:
        s.settimeout(max(0.1, limit - (time.perf_counter() - t0)))
        try:
            while s.recv(4096):
                pass
            closed_at.append(time.perf_counter() - t0)
        except socket.timeout:
            pass
        except OSError:
            closed_at.append(time.perf_counter() - t0)
        s.close()
    out = w.done()
    out.update({"connections": n, "closed_by_server": len(closed_at), "limit_s": limit,
                "last_closed_s": round(max(closed_at), 2) if closed_at else None,
                "chat_during_status": chat_status})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hostd", default=os.path.join(ROOT, "target/release/hostd"))
    ap.add_argument("--model", default=os.path.join(ROOT, "tests/fixtures/models/tiny"))
    ap.add_argument("--flags", default="")
    ap.add_argument("--label", default="after")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    flags = a.flags.split()
    res = {}
    if a.only and os.path.exists(a.out):
        with open(a.out) as f:
            res = json.load(f)  # --only re-measures some scenarios and keeps the others
    res.update({"label": a.label, "hostd": a.hostd, "flags": flags, "model": a.model,
                "loadavg_at_start": os.getloadavg()[0]})
    scenarios = {
        "burst_4mb": lambda s: burst(s, "x" * 4_000_000),
        "burst_under_cap": lambda s: burst(s, ("hello world " * 83_334)[:1_000_000]),
        "half_open_500": half_open,
        "half_close": lambda s: dict(zip(("status", "detail"), (lambda r: (r[0], r[1][:120]))(s.exchange(
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", half_close=True, timeout=15)))),
        "slow_body": lambda s: (lambda t, r: {"status": r[0], "s": round(time.perf_counter() - t, 2), "detail": r[1][:120]})(
            time.perf_counter(), s.exchange(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
                                            b'{"model"', timeout=40)),
    }
    for name, fn in scenarios.items():
        if a.only and name not in a.only.split(","):
            continue
        srv = Server(a.hostd, a.model, flags)
        try:
            res[name] = fn(srv)
        finally:
            srv.close()
        print(name, json.dumps(res[name])[:400], flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
