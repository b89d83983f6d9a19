#!/usr/bin/env python3
"""Fault probes of the hostd -> expertd path (issue 14, part B), on the `tiny` fixture.

Runs the release binaries (target/release/hostd, expertd) and prints one JSON object per probe:

  stop:  a shared `expertd serve`, `hostd serve --expertd unix://... --expertd-call-timeout T`;
         a greedy reply, then a stream in flight, SIGSTOP for STOP_S seconds: when the stream
         fails and with what, how long a new request takes to fail (status, Retry-After), what
         /health says (sampled every 0.25 s), how long after SIGCONT /health is 200 again, and
         whether the greedy reply afterwards is the same.
  kill:  `hostd serve --experts expertd --container DIR` (private daemon); kill -9 the child
         with a stream in flight: when the stream fails, when a new child's socket is back,
         whether the old pid is reaped (no zombie), the next request's latency and reply, and
         after SIGTERM of hostd whether the child and its directory are gone.
  sweep: kill -9 hostd itself (its child exits on stdin EOF, its directory stays), then start
         another private daemon: the stale directory is removed.

Usage: bench/reliability/expert_path.py [--stop-s 30] [--deadline-s 5]
Times are wall-clock seconds measured by this script around HTTP requests on loopback; they
include the request's own generation time (milliseconds on `tiny`).
"""

import argparse
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTD = ROOT / "target/release/hostd"
EXPERTD = ROOT / "target/release/expertd"
MODEL = ROOT / "tests/fixtures/models/tiny"


def http(addr, method, path, body=None, timeout=120):
    req = urllib.request.Request(f"http://{addr}{path}", method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def greedy(addr):
    st, _, body = http(addr, "POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "temperature": 0})
    assert st == 200, body
    return json.loads(body)["choices"][0]["message"]


def health(addr):
    st, _, body = http(addr, "GET", "/health", timeout=10)
    return st, json.loads(body)


def start_hostd(args):
    p = subprocess.Popen([str(HOSTD), "serve", "--model", str(MODEL), "--port", "0", "--served-model-name", "tiny", *args],
                         stdout=subprocess.PIPE, stderr=open(os.environ.get("HOSTD_LOG", os.devnull), "a"), text=True, env={**os.environ, "SLUICE_THREADS": "2"})
    addr = p.stdout.readline().strip().rsplit("http://", 1)[1]
    t = time.time()
    while True:
        try:
            if health(addr)[0] == 200:
                return p, addr
        except Exception:
            pass
        assert time.time() - t < 60, "hostd not ready"
        time.sleep(0.05)


class Stream(threading.Thread):
    """A long greedy stream; records when and how it ended."""

    def __init__(self, addr):
        super().__init__(daemon=True)
        self.addr, self.started, self.chunks, self.error, self.ended = addr, threading.Event(), 0, None, None
        self.stop = threading.Event()

    def run(self):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "max_tokens": 200000, "ignore_eos": True, "stream": True, "temperature": 0}
        req = urllib.request.Request(f"http://{self.addr}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                if self.stop.is_set():
                    return
                if line.startswith(b"data: "):
                    self.chunks += 1
                    if self.chunks >= 3:
                        self.started.set()
                    data = line[6:].strip()
                    if data != b"[DONE]":
                        v = json.loads(data)
                        if "error" in v:
                            self.error = v["error"]["code"]
        self.ended = time.time()


def children(pid):
    out = set()
    for t in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(x) for x in (t / "children").read_text().split()}
    return out


def private_child(pid):
    for c in children(pid):
        args = Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")
        if b"--socket" in args:
            return c, Path(args[args.index(b"--socket") + 1].decode()).parent
    return None, None


def probe_stop(work, container, stop_s, deadline_s):
    sock = Path(work) / "expertd.sock"
    d = subprocess.Popen([str(EXPERTD), "serve", "--container", str(container), "--socket", str(sock), "--cache-bytes", str(64 << 20)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not sock.exists():
        time.sleep(0.02)
    h, addr = start_hostd(["--expertd", f"unix://{sock}", "--container", str(container), "--expertd-call-timeout", str(deadline_s)])
    try:
        before = greedy(addr)
        s = Stream(addr)
        s.start()
        s.started.wait(30)
        d.send_signal(signal.SIGSTOP)
        t0 = time.time()
        new_req = {}

        def new_request():
            t = time.time()
            st, hdr, body = http(addr, "POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            new_req.update({"status": st, "code": json.loads(body)["error"]["code"], "retry_after": hdr.get("Retry-After") or hdr.get("retry-after"), "s": round(time.time() - t, 2)})

        # A request sent right after the stop, while the stream's call is still in flight.
        threading.Thread(target=new_request, daemon=True).start()
        states = []
        while time.time() - t0 < stop_s:
            hs, hb = health(addr)
            if not states or states[-1][1] != hb["status"]:
                states.append((round(time.time() - t0, 2), hb["status"], hs))
            time.sleep(0.25)
        # And one sent late in the stop, when no call is in flight.
        late = {}
        t = time.time()
        st, hdr, body = http(addr, "POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        late.update({"status": st, "code": json.loads(body)["error"]["code"], "s": round(time.time() - t, 2)})
        d.send_signal(signal.SIGCONT)
        t1 = time.time()
        while health(addr)[0] != 200:
            assert time.time() - t1 < 30, "not ready after SIGCONT"
            time.sleep(0.05)
        ready_after = round(time.time() - t1, 2)
        after = greedy(addr)
        return {"probe": "stop", "stop_s": stop_s, "deadline_s": deadline_s, "in_flight_stream_error": s.error,
                "in_flight_failed_after_s": None if s.ended is None else round(s.ended - t0, 2), "new_request_at_stop": new_req, "new_request_late": late,
                "health_during_stop": states, "ready_after_cont_s": ready_after, "same_greedy_reply": before == after}
    finally:
        h.kill()
        d.kill()
        d.send_signal(signal.SIGCONT)
        d.wait()


def probe_kill(container):
    h, addr = start_hostd(["--experts", "expertd", "--container", str(container)])
    try:
        before = greedy(addr)
        old, dirpath = private_child(h.pid)
        s = Stream(addr)
        s.start()
        s.started.wait(30)
        os.kill(old, signal.SIGKILL)
        t0 = time.time()
        new = None
        while True:
            c, dd = private_child(h.pid)
            if c and c != old and (dd / "expertd.sock").exists():
                new = c
                break
            assert time.time() - t0 < 30, "not restarted"
            time.sleep(0.01)
        restarted = round(time.time() - t0, 3)
        zombie = Path(f"/proc/{old}").exists()
        time.sleep(0.1)  # the supervisor counts the restart once it saw the socket
        s.join(5)
        s.stop.set()
        chunks_after_kill = s.chunks
        t = time.time()
        after = greedy(addr)
        next_s = round(time.time() - t, 3)
        hs, hb = health(addr)
        h.send_signal(signal.SIGTERM)
        h.wait(30)
        time.sleep(0.2)
        return {"probe": "kill", "in_flight_stream_error": s.error, "in_flight_failed_after_s": None if s.ended is None else round(s.ended - t0, 3),
                "in_flight_stream_chunks": chunks_after_kill,
                "restarted_after_s": restarted, "old_pid_zombie": zombie, "next_request_s": next_s, "same_greedy_reply": before == after,
                "health_after": [hs, hb["status"], hb["experts"]["restarts"]], "child_gone_after_exit": not Path(f"/proc/{new}").exists(),
                "dir_gone_after_exit": not dirpath.exists()}
    finally:
        h.kill()


def probe_sweep(container):
    h, _ = start_hostd(["--experts", "expertd", "--container", str(container)])
    child, dirpath = private_child(h.pid)
    h.kill()
    h.wait()
    t = time.time()
    while Path(f"/proc/{child}/cmdline").exists() and Path(f"/proc/{child}/cmdline").read_bytes() and time.time() - t < 10:
        time.sleep(0.05)
    child_exit_s = round(time.time() - t, 2)
    left = dirpath.exists()
    h2, _ = start_hostd(["--experts", "expertd", "--container", str(container)])
    swept = not dirpath.exists()
    h2.send_signal(signal.SIGTERM)
    h2.wait(30)
    return {"probe": "sweep", "dir_left_by_killed_hostd": left, "child_exited_after_s": child_exit_s, "removed_by_next_start": swept}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stop-s", type=float, default=30)
    ap.add_argument("--deadline-s", type=float, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        container = Path(work) / "container"
        subprocess.run([str(EXPERTD), "prepare", str(MODEL), "--out", str(container)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for r in (probe_stop(work, container, a.stop_s, a.deadline_s), probe_kill(container), probe_sweep(container)):
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
