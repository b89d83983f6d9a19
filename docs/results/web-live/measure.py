"""Decode tok/s of `hostd serve` with and without a `/v1/live` reader (what the web page
opens: one frame per second), interleaved round by round on one warm server.

Each round runs one streaming greedy chat request of N tokens (stop tokens biased away, so every
round decodes exactly N) and times decode from the first streamed token to the last: tok/s =
(N - 1) / (t_last - t_first). Rounds alternate off/on (the order flips every round). Prints one
JSON object: per condition the rounds' tok/s, their median, and the ratio on/off of medians."""

import json
import statistics
import sys
import subprocess
import time
import urllib.request

base, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# The model's stop ids (generation_config.json's eos_token_id), biased away.
NO_EOS = {str(i): -100 for i in json.loads(sys.argv[4])}


def decode_rate():
    body = json.dumps({
        "model": json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"],
        "messages": [{"role": "user", "content": "Describe the sea at night in detail."}],
        "max_tokens": n, "temperature": 0, "stream": True, "logit_bias": NO_EOS,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    first = last = None
    pieces = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            ch = chunk.get("choices") or []
            if ch and (ch[0]["delta"].get("content") or ch[0]["delta"].get("reasoning_content")):
                now = time.perf_counter()
                first = first or now
                last = now
                pieces += 1
            if chunk.get("usage"):
                assert chunk["usage"]["completion_tokens"] == n, chunk["usage"]
    # Tokens that end inside a UTF-8 character stream with the next one: pieces <= tokens.
    assert pieces >= n // 2, pieces
    return (n - 1) / (last - first)


class Reader:
    """Reads /v1/live (1 s frames, what the page opens) in a separate process (curl), so the
    reader's own work does not share this script's interpreter with the timing loop."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["curl", "-sN", base + "/v1/live?interval_ms=1000"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def stop(self):
        self.proc.terminate()
        out, _ = self.proc.communicate()
        return out.count(b"data:")


decode_rate()  # warm-up, not counted
rates = {"off": [], "on": []}
frames = 0
for i in range(rounds):
    for cond in (("off", "on") if i % 2 == 0 else ("on", "off")):
        reader = Reader() if cond == "on" else None
        if reader:
            time.sleep(1.5)  # the reader's first frames arrive before the request starts
        rates[cond].append(decode_rate())
        if reader:
            frames += reader.stop()
med = {k: statistics.median(v) for k, v in rates.items()}
print(json.dumps({
    "rounds": rounds, "tokens_per_request": n, "live_frames_read": frames,
    "decode_tok_s": rates, "median_tok_s": med,
    "ratio_on_over_off": med["on"] / med["off"],
}, indent=1))
