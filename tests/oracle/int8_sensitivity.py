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

    def routed_experts(self, p, x, ids, wts):
        """spec_reference's routed experts with fake-quantised weights (and activations, by mode)."""
        W, f = self.w, self.tc["moe_intermediate_size"]
        wg, aq, ag = self.mode
        key = (id(W), p, self.mode)
        if key not in self.cache:
            self.cache[key] = (fake_quant(W[p + "experts.gate_up_proj"], wg), fake_quant(W[p + "experts.down_proj"], wg))
        GU, D = self.cache[key]
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            xt = fake_quant(x[t][None], ag)[0] if aq else x[t]
            for j in range(ids.shape[1]):
                e = ids[t, j]
                gu = GU[e] @ xt
                h = sr.silu(gu[:f]) * gu[f:]
                if aq:
                    h = fake_quant(h[None], ag)[0]
                out[t] += wts[t, j] * (D[e] @ h)
        return out


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
