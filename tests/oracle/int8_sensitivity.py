#!/usr/bin/env python3
"""How sensitive are the oracle fixtures to INT8 expert quantisation? (numpy, no torch needed)

Runs spec_reference.py's float32 forward pass with the routed experts' weights (and optionally
activations) fake-quantised, teacher-forced on each reference prompt + greedy continuation, and
prints the top-1 agreement with the transformers fp32 logits over all positions, separately for
the random-weight presets and the trained one — the same metric tests/it/int8_quality.rs
measures for the Rust W8A8 path.

    python3 tests/oracle/int8_sensitivity.py "(None, False, None)" "(None, True, None)" "(8, False, None)"

Each mode is (weight_group, quantise_activations, activation_group): group None = one scale per
row, N = one scale per N columns.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import spec_reference as sr  # noqa: E402


def fake_quant(w, group=None):
    """Symmetric int8 per row (or per `group` columns of a row), round half to even."""
    if group is not None:
        shape = w.shape
        g = w.reshape(*shape[:-1], shape[-1] // group, group)
        return fake_quant(g).reshape(shape)
    m = np.abs(w).max(-1, keepdims=True)
    s = np.where(m > 0, m / 127, 1)
    return np.clip(np.rint(w / s), -127, 127) * s


BASE = [getattr(sr, n) for n in dir(sr) if isinstance(getattr(sr, n), type) and hasattr(getattr(sr, n), "moe")][0]


class Quantised(BASE):
    mode = (None, False, None)
    cache = {}

    def moe(self, i, x):
        tc, W = self.tc, self.w
        p = f"model.language_model.layers.{i}.mlp."
        k, f = tc["num_experts_per_tok"], tc["moe_intermediate_size"]
        r = x @ W[p + "gate.weight"].T
        pr = np.exp(r - r.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        ids = np.argsort(-pr, axis=-1, kind="stable")[:, :k]
        wts = np.take_along_axis(pr, ids, -1)
        wts /= wts.sum(-1, keepdims=True)
        wg, aq, ag = self.mode
        key = (id(W), p, self.mode)
        if key not in self.cache:
            self.cache[key] = (fake_quant(W[p + "experts.gate_up_proj"], wg), fake_quant(W[p + "experts.down_proj"], wg))
        GU, D = self.cache[key]
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            xt = fake_quant(x[t][None], ag)[0] if aq else x[t]
            for j in range(k):
                e = ids[t, j]
                gu = GU[e] @ xt
                h = sr.silu(gu[:f]) * gu[f:]
                if aq:
                    h = fake_quant(h[None], ag)[0]
                out[t] += wts[t, j] * (D[e] @ h)
        sh = (sr.silu(x @ W[p + "shared_expert.gate_proj.weight"].T) * (x @ W[p + "shared_expert.up_proj.weight"].T)) \
            @ W[p + "shared_expert.down_proj.weight"].T
        s = sr.sigmoid(x @ W[p + "shared_expert_gate.weight"].T)
        return out + s * sh, ids, wts


def logits(ref_dir, block):
    n = int(np.prod(block["shape"]))
    return np.fromfile(os.path.join(ref_dir, block["path"]), dtype="<f4", count=n, offset=block["offset"]).reshape(block["shape"])


def main():
    ref_dir = os.path.join(ROOT, "tests/fixtures/reference")
    for mode in [eval(a) for a in sys.argv[1:]] or [(None, False, None), (None, True, None)]:
        Quantised.mode = mode
        counts = {}
        presets = sorted(d for d in os.listdir(os.path.join(ROOT, "tests/fixtures/models")) if not d.startswith("."))
        for preset in presets:
            ref = json.load(open(os.path.join(ref_dir, f"{preset}.json")))
            group = "trained" if "training" in ref else "random-weight"
            agree, total = counts.get(group, (0, 0))
            model = Quantised(os.path.join(ROOT, "tests/fixtures/models", preset), np.float32)
            for p in ref["prompts"]:
                seq = p["input_ids"] + p["greedy_ids"][:-1]
                ours, _ = model.forward(seq)
                theirs = np.concatenate([logits(ref_dir, p["prompt_logits_file"]), logits(ref_dir, p["greedy_logits_file"])[1:]])
                agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
                total += len(seq)
            counts[group] = (agree, total)
        for group, (agree, total) in sorted(counts.items()):
            print(f"mode {mode}, {group} presets: top-1 agreement {agree}/{total} = {100 * agree / total:.2f}%", flush=True)


if __name__ == "__main__":
    main()
