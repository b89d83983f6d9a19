#!/usr/bin/env python3
"""One round of a bench/peers/longctx.sh folder, read the same way for its own summary and for
bench/headline_summary.py: sluice's `hostd profile` JSON (if the round ran it) and llama.cpp's
prefill and decode-at-depth rates, from llama-completion's JSON or llama-bench's, whichever the
round wrote.

Usage (the summary longctx.sh prints): longctx_round.py OUT ROUNDS"""
import json
import os
import sys


def read(d: str, r: int):
    """Round `r` of folder `d`: a dict with `sluice` (the profile JSON, or None), `llama_prefill`,
    `llama_decode` and `llama_tool`; None when the round has no llama.cpp result."""
    def load(name):
        path = os.path.join(d, name)
        return json.load(open(path)) if os.path.exists(path) else None
    cli, pp, tg = load(f"llama-cli-r{r}.json"), load(f"llama-pp-r{r}.json"), load(f"llama-tg-r{r}.json")
    if cli is not None:
        lp, ld, tool = cli["prompt_tokens_per_s"], cli["eval_tokens_per_s"], "llama-completion"
    elif pp is not None and tg is not None:
        lp, ld, tool = pp[0]["avg_ts"], tg[0]["avg_ts"], "llama-bench"
    else:
        return None
    return {"sluice": load(f"sluice-r{r}.json"), "llama_prefill": lp, "llama_decode": ld, "llama_tool": tool}


def main() -> None:
    out, rounds = sys.argv[1], int(sys.argv[2])
    for r in range(1, rounds + 1):
        x = read(out, r)
        if x is None:
            print(f"round {r}: no llama.cpp result")
            continue
        pp, tg, s = x["llama_prefill"], x["llama_decode"], x["sluice"]
        if s is None:
            print(f"round {r}: llama prefill {pp:.2f} tok/s, decode at depth {tg:.2f} tok/s (no sluice run in this round)")
            continue
        sp, sd = s["prefill"]["tokens_per_s"], s["decode"]["tokens_per_s"]
        print(f"round {r}: prefill sluice {sp:.2f} llama {pp:.2f} ratio {sp/pp:.2f}; decode at depth sluice {sd:.2f} llama {tg:.2f} ratio {sd/tg:.2f}")


if __name__ == "__main__":
    main()
