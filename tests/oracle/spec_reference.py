#!/usr/bin/env python3
"""Independent float64 forward pass written from docs/model.md §4 (recurrent DeltaNet form).

Used by make_fixtures.py to cross-check transformers' reference on every fixture checkpoint (so that the
fixtures agree with the math of docs/model.md §4, not only with transformers).  Reads the checkpoint files directly
(config.json + index + shards); no transformers code involved.

  python3 tests/oracle/spec_reference.py tests/fixtures/models/tiny 1 2 3   # prints argmax per position
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np


def load_checkpoint(model_dir: str, dtype=np.float64):
    from safetensors import safe_open

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tc = cfg["text_config"]
    index = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))
    w = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(model_dir, shard), framework="pt") as fh:
            for name in fh.keys():
                if name.startswith("model.language_model.") or name == "lm_head.weight":
                    w[name] = fh.get_tensor(name).double().numpy().astype(dtype)
    return tc, w


def layer_types(tc) -> list:
    if tc.get("layer_types") is not None:
        return list(tc["layer_types"])
    iv = tc.get("full_attention_interval", 4)
    return ["linear_attention" if (i + 1) % iv else "full_attention" for i in range(tc["num_hidden_layers"])]


def zc_rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2n(x, eps=1e-6):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


class SpecModel:
    def __init__(self, model_dir: str, dtype=np.float64):
        """dtype float64 (default): the exact-math yardstick; float32: what a plain fp32 engine would do."""
        self.dtype = dtype
        self.tc, self.w = load_checkpoint(model_dir, dtype)
        self.types = layer_types(self.tc)
        self.eps = self.tc["rms_norm_eps"]
        rp = self.tc.get("rope_parameters") or {}
        self.theta = rp.get("rope_theta", self.tc.get("rope_theta"))
        prf = rp.get("partial_rotary_factor", self.tc.get("partial_rotary_factor", 0.25))
        self.dr = int(self.tc["head_dim"] * prf)

    def attn(self, i, a):
        tc, W = self.tc, self.w
        p = f"model.language_model.layers.{i}.self_attn."
        T = a.shape[0]
        nq, nkv, dh = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
        P = (a @ W[p + "q_proj.weight"].T).reshape(T, nq, 2 * dh)
        q, gate = P[..., :dh], P[..., dh:]
        k = (a @ W[p + "k_proj.weight"].T).reshape(T, nkv, dh)
        v = (a @ W[p + "v_proj.weight"].T).reshape(T, nkv, dh)
        q = zc_rms(q, W[p + "q_norm.weight"], self.eps)
        k = zc_rms(k, W[p + "k_norm.weight"], self.eps)
        half = self.dr // 2
        omega = self.theta ** (-np.arange(half) * 2.0 / self.dr)
        ang = np.arange(T)[:, None] * omega[None, :]
        cos = np.cos(ang)[:, None, :].astype(self.dtype)
        sin = np.sin(ang)[:, None, :].astype(self.dtype)

        def rope(x):
            x = x.copy()
            x1, x2 = x[..., :half].copy(), x[..., half:self.dr].copy()
            x[..., :half] = x1 * cos - x2 * sin
            x[..., half:self.dr] = x2 * cos + x1 * sin
            return x

        q, k = rope(q), rope(k)
        G = nq // nkv
        o = np.zeros((T, nq, dh), dtype=self.dtype)
        mask = np.tril(np.ones((T, T), dtype=bool))
        for h in range(nq):
            g = h // G
            s = q[:, h] @ k[:, g].T / self.dtype(math.sqrt(dh))
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o[:, h] = s @ v[:, g]
        o = o * sigmoid(gate)
        return o.reshape(T, nq * dh) @ W[p + "o_proj.weight"].T

    def gdn(self, i, a):
        tc, W = self.tc, self.w
        p = f"model.language_model.layers.{i}.linear_attn."
        T = a.shape[0]
        nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
        dk, dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
        K = tc["linear_conv_kernel_dim"]
        X = a @ W[p + "in_proj_qkv.weight"].T
        Z = (a @ W[p + "in_proj_z.weight"].T).reshape(T, nv, dv)
        B = a @ W[p + "in_proj_b.weight"].T
        A = a @ W[p + "in_proj_a.weight"].T
        cw = W[p + "conv1d.weight"][:, 0, :]
        Xp = np.concatenate([np.zeros((K - 1, X.shape[1]), dtype=self.dtype), X])
        Y = np.zeros_like(X)
        for m in range(K):
            Y += cw[:, m][None, :] * Xp[m:m + T]
        Y = silu(Y)
        q = Y[:, :nk * dk].reshape(T, nk, dk)
        k = Y[:, nk * dk:2 * nk * dk].reshape(T, nk, dk)
        v = Y[:, 2 * nk * dk:].reshape(T, nv, dv)
        beta = sigmoid(B)
        g = -np.exp(W[p + "A_log"]) * softplus(A + W[p + "dt_bias"])
        qh = l2n(q) / self.dtype(math.sqrt(dk))
        kh = l2n(k)
        R = nv // nk
        S = np.zeros((nv, dk, dv), dtype=self.dtype)
        O = np.zeros((T, nv, dv), dtype=self.dtype)
        hq = np.arange(nv) // R
        for t in range(T):
            S *= np.exp(g[t])[:, None, None]
            kt, qt = kh[t, hq], qh[t, hq]                      # [nv, dk]
            u = beta[t][:, None] * (v[t] - np.einsum("hij,hi->hj", S, kt))
            S += kt[:, :, None] * u[:, None, :]
            O[t] = np.einsum("hij,hi->hj", S, qt)
        On = O / np.sqrt(np.mean(O * O, axis=-1, keepdims=True) + self.eps) * W[p + "norm.weight"] * silu(Z)
        return On.reshape(T, nv * dv) @ W[p + "out_proj.weight"].T

    def moe(self, i, x):
        """Layer i's MoE block: the routed experts' weighted sum plus the gated shared expert."""
        W = self.w
        p = f"model.language_model.layers.{i}.mlp."
        r = x @ W[p + "gate.weight"].T
        pr = np.exp(r - r.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        ids = np.argsort(-pr, axis=-1, kind="stable")[:, :self.tc["num_experts_per_tok"]]
        wts = np.take_along_axis(pr, ids, -1)
        wts /= wts.sum(-1, keepdims=True)
        out = self.routed_experts(p, x, ids, wts)
        sh = (silu(x @ W[p + "shared_expert.gate_proj.weight"].T) * (x @ W[p + "shared_expert.up_proj.weight"].T)) \
            @ W[p + "shared_expert.down_proj.weight"].T
        s = sigmoid(x @ W[p + "shared_expert_gate.weight"].T)
        return out + s * sh, ids, wts

    def routed_experts(self, p, x, ids, wts):
        """Σ_j wts[t, j] · expert ids[t, j](x[t]) for each row t, experts of the MLP prefix p."""
        W, f = self.w, self.tc["moe_intermediate_size"]
        out = np.zeros_like(x)
        GU, D = W[p + "experts.gate_up_proj"], W[p + "experts.down_proj"]
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e = ids[t, j]
                gu = GU[e] @ x[t]
                out[t] += wts[t, j] * (D[e] @ (silu(gu[:f]) * gu[f:]))
        return out

    def forward(self, ids):
        W = self.w
        h = W["model.language_model.embed_tokens.weight"][np.asarray(ids)]
        routes = []
        for i, lt in enumerate(self.types):
            pre = f"model.language_model.layers.{i}."
            a = zc_rms(h, W[pre + "input_layernorm.weight"], self.eps)
            h = h + (self.gdn(i, a) if lt == "linear_attention" else self.attn(i, a))
            b = zc_rms(h, W[pre + "post_attention_layernorm.weight"], self.eps)
            m, rid, rw = self.moe(i, b)
            routes.append((rid, rw))
            h = h + m
        hn = zc_rms(h, W["model.language_model.norm.weight"], self.eps)
        return hn @ W["lm_head.weight"].T, routes


if __name__ == "__main__":
    model = SpecModel(sys.argv[1])
    logits, _ = model.forward([int(x) for x in sys.argv[2:]])
    print(logits.argmax(-1).tolist())
