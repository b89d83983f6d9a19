#!/usr/bin/env python3
"""The long-prompt reference: transformers fp32 logits of the `tiny` fixture on a 2200-token prompt.

  python3 tests/oracle/make_long_reference.py

writes tests/fixtures/reference/tiny_long.json: the prompt ids, the logits at a few positions (both sides of the
attention kernel's 1024-position segment boundaries, and the last), each position's top-5 ids and the router's
smallest top-k probability gap over the prompt (how close any routing decision came to a tie). Only that, not the
full [T, vocab] matrix, so the file stays small. Uses the committed checkpoint under tests/fixtures/models/tiny
(max_position_embeddings 262144), the same loader and settings as make_fixtures.py; deterministic.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_fixtures as mf  # noqa: E402  (sets the offline environment, imports torch)
import torch  # noqa: E402

PRESET = "tiny"
PROMPT_TOKENS = 2200
POSITIONS = [0, 1023, 1024, 1025, 2047, 2048, PROMPT_TOKENS - 1]
TOP_K = 5


def prompt_ids(ranks: int) -> list:
    """A deterministic pseudo-random prompt over the BPE ranks (no specials)."""
    return [(i * 2654435761 >> 7) % ranks for i in range(PROMPT_TOKENS)]


@torch.no_grad()
def main() -> int:
    torch.manual_seed(0)
    torch.set_num_threads(mf.TORCH_THREADS)
    torch.use_deterministic_algorithms(True)
    model_dir = os.path.join(mf.MODELS_DIR, PRESET)
    model = mf.load_text_model(model_dir)
    ids = prompt_ids(mf.PRESETS[PRESET]["ranks"])
    tap = mf.RouterTap(model)
    logits, _, calls, _ = mf.full_forward(model, tap, ids)
    gap = min(float(c[3].min()) for c in calls)
    rows = [
        {
            "position": p,
            "logits": [mf.f32_short(v) for v in logits[p].tolist()],
            "top_ids": [int(i) for i in torch.topk(logits[p], TOP_K).indices.tolist()],
        }
        for p in POSITIONS
    ]
    out = {
        "what": "transformers fp32 logits of the tiny fixture on a long prompt (make_long_reference.py)",
        "preset": PRESET,
        "input_ids": ids,
        "positions": rows,
        "router_min_gap": gap,
    }
    path = os.path.join(mf.REF_DIR, f"{PRESET}_long.json")
    mf.dump_json(path, out, indent=None)
    print(json.dumps({"written": path, "bytes": os.path.getsize(path), "router_min_gap": gap}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
