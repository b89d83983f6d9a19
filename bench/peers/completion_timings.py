#!/usr/bin/env python3
"""Reads llama-completion's stderr (its `common_perf_print` timing lines, and `/usr/bin/time -v`'s
peak RSS when present) and prints them as JSON: the prefill (prompt eval) and the decode (eval)
times, token counts and rates exactly as llama.cpp reports them.

Usage: completion_timings.py STDERR_FILE [PROMPT_TOKENS]  (fails unless the prompt eval counted
exactly PROMPT_TOKENS tokens, when given)"""
import json
import re
import sys

text = open(sys.argv[1]).read()
prompt = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", text)
decode = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", text.replace("prompt eval time", "prompt_eval_time"))
if not prompt or not decode:
    sys.exit(f"completion_timings: no prompt eval / eval timing lines in {sys.argv[1]}")
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
p_ms, p_n = float(prompt.group(1)), int(prompt.group(2))
e_ms, e_n = float(decode.group(1)), int(decode.group(2))
if len(sys.argv) > 2 and p_n != int(sys.argv[2]):
    sys.exit(f"completion_timings: llama.cpp evaluated {p_n} prompt tokens, not {sys.argv[2]}")
print(json.dumps({
    "what": "llama-completion's own timings: prompt eval = the prefill of the prompt; eval = the decode steps after it (the first new token is sampled from the prompt eval, so eval runs = new tokens - 1)",
    "prompt_tokens": p_n,
    "prompt_ms": p_ms,
    "prompt_tokens_per_s": p_n / p_ms * 1e3,
    "eval_runs": e_n,
    "eval_ms": e_ms,
    "eval_tokens_per_s": e_n / e_ms * 1e3 if e_n and e_ms > 0 else None,
    "max_rss_bytes": int(rss.group(1)) * 1024 if rss else None,
}, indent=1))
