#!/usr/bin/env python3
"""Generate the random-weight Qwen3.5/3.6-MoE checkpoints and their transformers reference outputs.

Authority: docs/model.md (§2 config nesting, §3 tensor names, shapes and dtypes, §4 math).

  python3 tests/oracle/make_fixtures.py [--preset NAME ...]

writes, for every preset (default: all):

  tests/fixtures/models/<preset>/      config.json (nested, like the real release), generation_config.json,
                                       tokenizer.json (truncated real vocabulary), tokenizer_config.json,
                                       model.safetensors.index.json, model-0000K-of-0000N.safetensors
  tests/fixtures/reference/<preset>.json        prompts, greedy continuations, router choices, facts
  tests/fixtures/reference/<preset>.logits.f32  raw little-endian f32 logits referenced by the JSON

Everything is deterministic (fixed seeds, fixed thread count): rerunning produces identical bytes.
See tests/oracle/README.md for the schema and the exact definitions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys
import time
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import build_tokenizer as bt  # noqa: E402  (written by the tokenizer helper; the truncated vocabulary)
from spec_reference import SpecModel  # noqa: E402  (independent float64 forward written from docs/model.md §4)
import train_fixture as tf  # noqa: E402  (the trained preset: corpus, held-out prompts, training loop)

REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
MODELS_DIR = os.path.join(FIXTURES, "models")
REF_DIR = os.path.join(FIXTURES, "reference")

TORCH_THREADS = 2
N_GREEDY = 16

L_ATTN = "linear_attention"
F_ATTN = "full_attention"

# ---------------------------------------------------------------------------------------------------------------
# Presets.  Every preset has >= 1 full-attention and >= 1 DeltaNet layer, partial_rotary_factor 0.25,
# rope_theta 1e7, rms_norm_eps 1e-6, conv kernel 4 and a shared expert, like the real model.
#   layer_types: explicit list written to config.json, or None = omitted (synthesised from
#                full_attention_interval by transformers: layer i is full iff (i+1) % interval == 0).
#   interval:    full_attention_interval written to config.json (None = key omitted).
#   ranks:       N = number of BPE ranks kept in the truncated vocabulary (specials at N..N+32).
# ---------------------------------------------------------------------------------------------------------------
PRESETS = {
    "tiny": dict(
        seed=1, ranks=400, vocab_size=448,
        hidden=64, layers=4, layer_types=None, interval=2,           # -> [L, F, L, F]
        nq=4, nkv=2, head_dim=32,                                    # GQA 2:1, rotary dims 8
        mrope_section=[2, 1, 1],
        lin_k_heads=2, lin_v_heads=4, lin_k_dim=16, lin_v_dim=16,   # nv/nk = 2 like the real model
        experts=8, topk=2, moe_inter=32, shared_inter=32,
        shards=2,
    ),
    "small": dict(
        seed=2, ranks=700, vocab_size=736,
        hidden=80, layers=5, layer_types=[L_ATTN, F_ATTN, L_ATTN, L_ATTN, F_ATTN], interval=4,
        # NOTE: full_attention_interval=4 would give [L,L,L,F,L]; the explicit layer_types list is
        # authoritative (docs/model.md §2.1) and disagrees on purpose.
        nq=6, nkv=2, head_dim=16,                                    # GQA 3:1, rotary dims 4
        mrope_section=[1, 1, 0],
        lin_k_heads=3, lin_v_heads=6, lin_k_dim=16, lin_v_dim=24,   # nv/nk = 2, dk != dv
        experts=16, topk=4, moe_inter=24, shared_inter=48,          # shared inner != routed inner
        shards=3,
    ),
    "wide": dict(
        seed=3, ranks=600, vocab_size=640,
        hidden=128, layers=3, layer_types=[F_ATTN, L_ATTN, L_ATTN], interval=None,
        nq=8, nkv=1, head_dim=64,                                    # GQA 8:1 (like the real model), rotary 16
        mrope_section=[3, 3, 2],
        lin_k_heads=4, lin_v_heads=4, lin_k_dim=32, lin_v_dim=32,   # nv/nk = 1
        experts=32, topk=8, moe_inter=16, shared_inter=64,          # top-8 like the real model
        shards=2,
    ),
    # Trained (train_fixture.py): the same random initialisation, then 600 AdamW steps on English text, so
    # its next-token distributions are peaked like a language model's instead of flat.  3 DeltaNet + 1
    # attention layer like the real model's pattern; top-8 of 32 experts.  Two extra prompts from held-out
    # corpus text.
    "trained": dict(
        seed=4, ranks=600, vocab_size=640,
        hidden=128, layers=4, layer_types=[L_ATTN, L_ATTN, L_ATTN, F_ATTN], interval=4,
        nq=4, nkv=2, head_dim=32,                                    # GQA 2:1, rotary dims 8
        mrope_section=[2, 1, 1],
        lin_k_heads=2, lin_v_heads=4, lin_k_dim=32, lin_v_dim=32,   # nv/nk = 2
        experts=32, topk=8, moe_inter=32, shared_inter=64,
        shards=2,
        train=dict(steps=600, seq=128, batch=16, lr=3e-3, heldout_every=10, heldout_prompts=2, heldout_len=64),
    ),
}

# Vision tower stub (a complete depth-1 tower, tiny) so that loaders' skip logic is exercised and
# transformers' conditional-generation class still loads the checkpoint without missing keys.
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
              hidden_act="gelu_pytorch_tanh", initializer_range=0.02, deepstack_visual_indexes=[])

# Quality targets.  The router / lm_head are nudged (see `tune_margins`) until these hold with margin.
ROUTER_GAP_TARGET = 4e-4      # optimisation target (probability gap k-th vs (k+1)-th)
ROUTER_GAP_MIN = 1e-4         # asserted on the final reference
LOGIT_GAP_TARGET = 2e-2       # optimisation target (top1 - top2 logit at greedy steps)
LOGIT_GAP_MIN = 1e-3          # asserted on the final reference
CACHE_TOL = 1e-4              # cached decode vs no-cache full forward, max |logit diff|
CG_TOL = 1e-5                 # conditional-generation class vs text-only class
SPEC_TOL = 2e-4               # independent float64 spec implementation vs transformers fp32, max |logit diff|

TEXT_SHORT = ("The quick brown fox jumps over the lazy dog while the farmer counts his sheep "
              "and the children sing songs about rivers, mountains and the sea.")
TEXT_LONG = ("In the beginning the engineers wrote a small program that read numbers from a file, "
             "added them together and printed the result. Over the years the program grew: it learned "
             "to parse dates, to talk to databases, to send email and to draw charts. Every new feature "
             "was useful on its own, but together they made the code hard to change, and nobody "
             "remembered why some of the older parts existed at all.")
CHAT = [
    ("system", "You are a helpful assistant."),
    ("user", "What is the capital of France?"),
    ("assistant", "The capital of France is Paris."),
    ("user", "And of Italy?"),
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer side
# ---------------------------------------------------------------------------------------------------------------
def render_chat(messages, enable_thinking: bool = True) -> str:
    """ChatML rendering per docs/model.md §7.3 (past assistant turns before the last user query keep only the answer)."""
    out = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)
    out += "<|im_start|>assistant\n<think>\n" if enable_thinking else "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    return out


def make_prompts(ranks: int, extra=()):
    """The four standard prompts, then `extra` (name, topic, text, ids) prompts (a trained preset's held-out text)."""
    enc = lambda s: bt.reference_encode(s, max_ranks=ranks)  # noqa: E731  (NFC + tiktoken, specials allowed)
    short, long_ = enc(TEXT_SHORT), enc(TEXT_LONG)
    assert len(short) >= 20 and len(long_) >= 70, (len(short), len(long_))
    prompts = [
        ("len1", enc("The")[:1]),
        ("len20", short[:20]),
        ("len70", long_[:70]),
        ("chat", enc(render_chat(CHAT))),
    ]
    assert prompts[0][1] and prompts[3][1][0] == bt.special_ids(ranks)["<|im_start|>"]
    return prompts + [(name, ids) for name, _, _, ids in extra]


# ---------------------------------------------------------------------------------------------------------------
# Config files
# ---------------------------------------------------------------------------------------------------------------
def resolved_layer_types(p) -> list:
    if p["layer_types"] is not None:
        return list(p["layer_types"])
    iv = p["interval"]
    return [L_ATTN if (i + 1) % iv else F_ATTN for i in range(p["layers"])]


def text_config(p, sids) -> dict:
    rotary = int(p["head_dim"] * 0.25)
    assert sum(p["mrope_section"]) == rotary // 2, (p["mrope_section"], rotary)
    tc = {
        "model_type": "qwen3_5_moe_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "dtype": "bfloat16",
        "eos_token_id": sids["<|endoftext|>"],
    }
    if p["interval"] is not None:
        tc["full_attention_interval"] = p["interval"]
    tc.update({
        "head_dim": p["head_dim"],
        "hidden_act": "silu",
        "hidden_size": p["hidden"],
        "initializer_range": 0.02,
    })
    if p["layer_types"] is not None:
        tc["layer_types"] = list(p["layer_types"])
    tc.update({
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": p["lin_k_dim"],
        "linear_num_key_heads": p["lin_k_heads"],
        "linear_num_value_heads": p["lin_v_heads"],
        "linear_value_head_dim": p["lin_v_dim"],
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "mlp_only_layers": [],
        "moe_intermediate_size": p["moe_inter"],
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": p["nq"],
        "num_experts": p["experts"],
        "num_experts_per_tok": p["topk"],
        "num_hidden_layers": p["layers"],
        "num_key_value_heads": p["nkv"],
        "output_router_logits": False,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": list(p["mrope_section"]),
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": p["shared_inter"],
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": p["vocab_size"],
    })
    return tc


def vision_config(p) -> dict:
    vc = {"model_type": "qwen3_5_moe_vision"}
    vc.update(VISION)
    vc["out_hidden_size"] = p["hidden"]
    return vc


def full_config(p, sids) -> dict:
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "image_token_id": sids["<|image_pad|>"],
        "model_type": "qwen3_5_moe",
        "text_config": text_config(p, sids),
        "tie_word_embeddings": False,
        "transformers_version": "5.23.0",
        "video_token_id": sids["<|video_pad|>"],
        "vision_config": vision_config(p),
        "vision_end_token_id": sids["<|vision_end|>"],
        "vision_start_token_id": sids["<|vision_start|>"],
    }


def generation_config(sids) -> dict:
    return {
        "bos_token_id": sids["<|endoftext|>"],
        "do_sample": True,
        "eos_token_id": [sids["<|im_end|>"], sids["<|endoftext|>"]],
        "pad_token_id": sids["<|endoftext|>"],
        "temperature": 1.0,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "5.23.0",
    }


def tokenizer_config(sids) -> dict:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for s, i in sids.items()
        },
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


# ---------------------------------------------------------------------------------------------------------------
# Weights (docs/model.md §3).  Values: numpy PCG64 with a per-tensor seed derived from (preset seed, tensor name),
# rounded to bf16 (round-to-nearest-even).  A_log and linear_attn.norm.weight are F32 in the file and keep
# full f32 precision (so a loader that rounds them to bf16 does not match the fp32 reference).
# ---------------------------------------------------------------------------------------------------------------
def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def bf16(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)


def f32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).clone()


def text_tensors(p) -> dict:
    """name -> torch tensor (bf16 / f32) for the text model, in a fixed order."""
    s = p["seed"]
    d, V, N = p["hidden"], p["vocab_size"], p["ranks"] + bt.N_SPECIALS
    nq, nkv, dh = p["nq"], p["nkv"], p["head_dim"]
    nk, nv, dk, dv = p["lin_k_heads"], p["lin_v_heads"], p["lin_k_dim"], p["lin_v_dim"]
    E, f, fs = p["experts"], p["moe_inter"], p["shared_inter"]
    out = {}

    def normal(name, shape, std):
        return _rng(s, name).standard_normal(shape) * std

    def uniform(name, shape, lo, hi):
        return _rng(s, name).uniform(lo, hi, size=shape)

    def zc_norm(name, n):  # zero-centred RMSNorm weight: effective scale 1 + w
        out[name] = bf16(uniform(name, (n,), -0.25, 0.25))

    pre = "model.language_model."
    emb = normal(pre + "embed_tokens.weight", (V, d), 1.0)
    emb[N:] *= 0.01  # padding rows exist (like the real model) but are never fed
    out[pre + "embed_tokens.weight"] = bf16(emb)

    for i, lt in enumerate(resolved_layer_types(p)):
        lp = f"{pre}layers.{i}."
        if lt == L_ATTN:
            a = lp + "linear_attn."
            cqkv = 2 * nk * dk + nv * dv
            out[a + "in_proj_qkv.weight"] = bf16(normal(a + "in_proj_qkv.weight", (cqkv, d), 1.0 / math.sqrt(d)))
            out[a + "in_proj_z.weight"] = bf16(normal(a + "in_proj_z.weight", (nv * dv, d), 1.0 / math.sqrt(d)))
            out[a + "in_proj_b.weight"] = bf16(normal(a + "in_proj_b.weight", (nv, d), 1.0 / math.sqrt(d)))
            out[a + "in_proj_a.weight"] = bf16(normal(a + "in_proj_a.weight", (nv, d), 0.5 / math.sqrt(d)))
            out[a + "conv1d.weight"] = bf16(uniform(a + "conv1d.weight", (cqkv, 1, 4), -0.6, 0.6))
            # Mamba-style dt: dt log-uniform in [1e-3, 1e-1], dt_bias = softplus^-1(dt)
            dt = np.exp(uniform(a + "dt_bias", (nv,), math.log(1e-3), math.log(1e-1)))
            out[a + "dt_bias"] = bf16(np.log(np.expm1(dt)))
            out[a + "A_log"] = f32(np.log(uniform(a + "A_log", (nv,), 1.0, 16.0)))
            out[a + "norm.weight"] = f32(uniform(a + "norm.weight", (dv,), 0.7, 1.3))  # plain scale (not 1+w)
            out[a + "out_proj.weight"] = bf16(normal(a + "out_proj.weight", (d, nv * dv), 1.5 / math.sqrt(nv * dv)))
        else:
            a = lp + "self_attn."
            out[a + "q_proj.weight"] = bf16(normal(a + "q_proj.weight", (nq * dh * 2, d), 1.0 / math.sqrt(d)))
            out[a + "k_proj.weight"] = bf16(normal(a + "k_proj.weight", (nkv * dh, d), 1.0 / math.sqrt(d)))
            out[a + "v_proj.weight"] = bf16(normal(a + "v_proj.weight", (nkv * dh, d), 1.0 / math.sqrt(d)))
            out[a + "o_proj.weight"] = bf16(normal(a + "o_proj.weight", (d, nq * dh), 1.5 / math.sqrt(nq * dh)))
            zc_norm(a + "q_norm.weight", dh)
            zc_norm(a + "k_norm.weight", dh)
        m = lp + "mlp."
        out[m + "gate.weight"] = bf16(normal(m + "gate.weight", (E, d), 2.0 / math.sqrt(d)))
        out[m + "experts.gate_up_proj"] = bf16(normal(m + "experts.gate_up_proj", (E, 2 * f, d), 1.0 / math.sqrt(d)))
        out[m + "experts.down_proj"] = bf16(normal(m + "experts.down_proj", (E, d, f), 2.0 / math.sqrt(f)))
        out[m + "shared_expert.gate_proj.weight"] = bf16(normal(m + "shared_expert.gate_proj.weight", (fs, d), 1.0 / math.sqrt(d)))
        out[m + "shared_expert.up_proj.weight"] = bf16(normal(m + "shared_expert.up_proj.weight", (fs, d), 1.0 / math.sqrt(d)))
        out[m + "shared_expert.down_proj.weight"] = bf16(normal(m + "shared_expert.down_proj.weight", (d, fs), 1.5 / math.sqrt(fs)))
        out[m + "shared_expert_gate.weight"] = bf16(normal(m + "shared_expert_gate.weight", (1, d), 1.0 / math.sqrt(d)))
        zc_norm(lp + "input_layernorm.weight", d)
        zc_norm(lp + "post_attention_layernorm.weight", d)

    zc_norm(pre + "norm.weight", d)
    head = normal("lm_head.weight", (V, d), 3.0 / math.sqrt(d))
    head[N:] *= 0.01  # padding rows: tiny logits, never the argmax
    out["lm_head.weight"] = bf16(head)
    return out


def extra_tensors(p, vision_shapes: dict) -> dict:
    """Small mtp.* tensors and a complete depth-1 model.visual.* tower (to be skipped by text loaders)."""
    s, d = p["seed"], p["hidden"]
    out = {}
    mtp = {"mtp.fc.weight": (d, 2 * d), "mtp.pre_fc_norm_embedding.weight": (d,), "mtp.pre_fc_norm_hidden.weight": (d,),
           "mtp.norm.weight": (d,), "mtp.layers.0.input_layernorm.weight": (d,)}
    for name, shape in mtp.items():
        out[name] = bf16(_rng(s, name).standard_normal(shape) * 0.02)
    for name in sorted(vision_shapes):
        out[name] = bf16(_rng(s, name).standard_normal(vision_shapes[name]) * 0.02)
    return out


def shard_of(name: str, n_shards: int) -> int:
    """Shard assignment.  Layer i goes to shard i % S, except that for even i the routed experts' down_proj
    goes to the next shard (so gate_up_proj and down_proj of that layer live in different files)."""
    if name.startswith("model.visual."):
        return 0
    if name.startswith("mtp.") or name in ("lm_head.weight", "model.language_model.norm.weight"):
        return n_shards - 1
    if name == "model.language_model.embed_tokens.weight":
        return 0
    i = int(name.split(".")[3])
    if name.endswith("mlp.experts.down_proj") and i % 2 == 0:
        return (i + 1) % n_shards
    return i % n_shards


def shard_name(k: int, n: int) -> str:
    return f"model-{k + 1:05d}-of-{n:05d}.safetensors"


def write_checkpoint(out_dir: str, p, tensors: dict) -> list:
    from safetensors.torch import save_file

    n = p["shards"]
    groups = [dict() for _ in range(n)]
    for name, t in tensors.items():
        groups[shard_of(name, n)][name] = t.contiguous()
    assert all(groups), "every shard must hold at least one tensor"
    names = []
    for k, g in enumerate(groups):
        fn = shard_name(k, n)
        save_file(g, os.path.join(out_dir, fn), metadata={"format": "pt"})
        os.chmod(os.path.join(out_dir, fn), 0o644)
        names.append(fn)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total},
             "weight_map": {name: shard_name(shard_of(name, n), n) for name in sorted(tensors)}}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as fh:
        json.dump(index, fh, indent=2)
        fh.write("\n")
    return names


def dump_json(path: str, obj, indent=2) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=indent, ensure_ascii=False)
        fh.write("\n")


# ---------------------------------------------------------------------------------------------------------------
# Independent facts from the files we wrote (safetensors headers parsed by hand)
# ---------------------------------------------------------------------------------------------------------------
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4}


def read_headers(model_dir: str, shards: list) -> dict:
    """name -> (dtype, shape, nbytes, shard) straight from the safetensors headers."""
    out = {}
    for fn in shards:
        with open(os.path.join(model_dir, fn), "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            hdr = json.loads(fh.read(hlen))
        for name, info in hdr.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            nbytes = b - a
            assert nbytes == math.prod(info["shape"]) * DTYPE_BYTES[info["dtype"]], name
            assert name not in out, f"duplicate tensor {name}"
            out[name] = (info["dtype"], info["shape"], nbytes, fn)
    return out


def checkpoint_facts(p, model_dir: str, shards: list) -> dict:
    hdr = read_headers(model_dir, shards)
    index = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))
    assert index["weight_map"] == {n: v[3] for n, v in sorted(hdr.items())}, "index.json disagrees with the shards"
    d, E, f = p["hidden"], p["experts"], p["moe_inter"]
    is_text = lambda n: n.startswith("model.language_model.") or n == "lm_head.weight"  # noqa: E731
    is_routed = lambda n: ".mlp.experts." in n  # noqa: E731
    text = {n: v for n, v in hdr.items() if is_text(n)}
    routed = {n: v for n, v in text.items() if is_routed(n)}
    for n, (dt, shape, _, _) in routed.items():
        assert dt == "BF16" and shape in ([E, 2 * f, d], [E, d, f]), (n, dt, shape)
    expert_bytes = (2 * f * d + d * f) * 2
    routed_bytes = sum(v[2] for v in routed.values())
    assert routed_bytes == expert_bytes * E * p["layers"]
    # gate_up / down in different shards for some layers
    split = [i for i in range(p["layers"])
             if text[f"model.language_model.layers.{i}.mlp.experts.gate_up_proj"][3]
             != text[f"model.language_model.layers.{i}.mlp.experts.down_proj"][3]]
    assert split, "no layer has its fused experts split across shards"
    for n, (dt, _, _, _) in text.items():
        want = "F32" if (n.endswith("linear_attn.A_log") or n.endswith("linear_attn.norm.weight")) else "BF16"
        assert dt == want, (n, dt)
    return {
        "num_layers": p["layers"],
        "layer_types": resolved_layer_types(p),
        "num_experts": E,
        "experts_per_token": p["topk"],
        "hidden_size": d,
        "vocab_size": p["vocab_size"],
        "expert_bytes_bf16": expert_bytes,
        "routed_expert_bytes_bf16": routed_bytes,
        "dense_bytes_bf16": sum(v[2] for n, v in text.items() if not is_routed(n)),
        "text_tensor_count": len(text),
        "shards": list(shards),
    }


# ---------------------------------------------------------------------------------------------------------------
# transformers side
# ---------------------------------------------------------------------------------------------------------------
def load_text_model(model_dir: str):
    from transformers import Qwen3_5MoeForCausalLM

    model, info = Qwen3_5MoeForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True, local_files_only=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"text model did not load cleanly: {bad}"
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    assert model.config._experts_implementation == "eager", model.config._experts_implementation
    model.eval()
    return model


def causal_lm_names(tensors: dict) -> dict:
    """File name -> parameter name in transformers' text-only `Qwen3_5MoeForCausalLM`, for every text tensor
    (`model.language_model.*` -> `model.*`, `lm_head.weight` as is; `mtp.*` and `model.visual.*` have none)."""
    prefix = "model.language_model."
    return {n: ("model." + n[len(prefix):] if n.startswith(prefix) else n)
            for n in tensors if n.startswith(prefix) or n == "lm_head.weight"}


def assert_loaded_from_file(model, tensors: dict) -> None:
    """Every text tensor in the file equals the fp32 parameter transformers holds (upcast exactly), and vice versa."""
    sd = model.state_dict()
    mapped = {param: tensors[name] for name, param in causal_lm_names(tensors).items()}
    assert set(mapped) == set(sd), (sorted(set(mapped) ^ set(sd)))[:10]
    for k, t in mapped.items():
        assert sd[k].dtype == torch.float32, (k, sd[k].dtype)
        assert sd[k].shape == t.shape, (k, sd[k].shape, t.shape)
        assert torch.equal(sd[k], t.to(torch.float32)), f"{k} differs from the file"


class RouterTap:
    """Forward hooks on every layer's router (`mlp.gate`, Qwen3_5MoeTopKRouter).

    Records, per call and layer: the router input, the chosen ids (torch.topk order), the renormalised
    weights as the model uses them, and the probability gap between the k-th and (k+1)-th expert."""

    def __init__(self, model):
        self.layers = [layer.mlp.gate for layer in model.model.layers]
        self.k = self.layers[0].top_k
        self.calls = None
        self.handles = []
        for li, g in enumerate(self.layers):
            self.handles.append(g.register_forward_hook(self._hook(li)))

    def _hook(self, li):
        def hook(module, args, output):
            if self.calls is None:
                return
            x = args[0].reshape(-1, module.hidden_dim).detach().clone()
            logits, scores, idx = output
            probs = torch.softmax(logits.detach().float(), dim=-1)
            top = torch.topk(probs, self.k + 1, dim=-1).values
            gap = top[:, self.k - 1] - top[:, self.k]
            order_gap = (top[:, :-1] - top[:, 1:]).min(dim=-1).values
            self.calls[li].append((x, idx.detach().clone(), scores.detach().float().clone(), gap, order_gap))
        return hook

    def start(self):
        self.calls = [[] for _ in self.layers]

    def stop(self):
        calls, self.calls = self.calls, None
        return calls

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def run_prompt(model, tap: RouterTap, ids: list):
    """Prefill + 16-token greedy continuation with the KV/recurrent cache.

    Returns dict(prompt_logits [T,V], greedy_ids [16], greedy_logits [16,V],
                 router [L] of (ids [T,k], w [T,k]), greedy_router [L] of (ids [15,k], w [15,k]), gaps)."""
    L = len(tap.layers)
    tap.start()
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    calls = tap.stop()
    assert all(len(c) == 1 for c in calls)
    prompt_logits = out.logits[0].float().clone()
    router = [(calls[li][0][1], calls[li][0][2]) for li in range(L)]
    gaps = [calls[li][0][3] for li in range(L)]
    order_gaps = [calls[li][0][4] for li in range(L)]
    cache = out.past_key_values
    g_logits = [prompt_logits[-1]]
    g_ids = [int(torch.argmax(prompt_logits[-1]))]  # first maximal value = lowest id on ties
    g_router = [[] for _ in range(L)]
    for _ in range(1, N_GREEDY):
        tap.start()
        out = model(input_ids=torch.tensor([[g_ids[-1]]]), past_key_values=cache, use_cache=True)
        calls = tap.stop()
        cache = out.past_key_values
        row = out.logits[0, -1].float().clone()
        for li in range(L):
            assert len(calls[li]) == 1
            g_router[li].append((calls[li][0][1], calls[li][0][2]))
            gaps.append(calls[li][0][3])
            order_gaps.append(calls[li][0][4])
        g_logits.append(row)
        g_ids.append(int(torch.argmax(row)))
    greedy_router = [(torch.cat([r[0] for r in g_router[li]]), torch.cat([r[1] for r in g_router[li]]))
                     for li in range(L)]
    gl = torch.stack(g_logits)
    top2 = torch.topk(gl, 2, dim=-1).values
    return dict(prompt_logits=prompt_logits, greedy_ids=g_ids, greedy_logits=gl, router=router,
                greedy_router=greedy_router, router_min_gap=float(torch.cat(gaps).min()),
                router_order_gap=float(torch.cat(order_gaps).min()),
                greedy_min_gap=float((top2[:, 0] - top2[:, 1]).min()))


@torch.no_grad()
def full_forward(model, tap: RouterTap, ids: list):
    """No-cache forward over `ids`: logits [T,V], final normed hidden [T,d], router calls per layer."""
    tap.start()
    out = model(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    calls = tap.stop()
    return out.logits[0].float(), out.hidden_states[-1][0].float(), [c[0] for c in calls], out.hidden_states


def _prob_gap(X, W, k):
    """All consecutive gaps among the k+1 largest router probabilities, [n, k]: the last column decides the
    chosen set, the others the (descending-probability) order in which the ids are recorded."""
    probs = torch.softmax(X @ W.T, dim=-1)
    top = torch.topk(probs, k + 1, dim=-1).values
    return top[:, :-1] - top[:, 1:]


def _logit_gap(H, W):
    top = torch.topk(H @ W.T, 2, dim=-1).values
    return top[:, 0] - top[:, 1]


def _round_bf16(W):
    return W.detach().to(torch.bfloat16).to(torch.float32)


def _push_margin(W0, gap_fn, target, what):
    """Nudge W (fp32 copy of a bf16 matrix) by hinge-loss gradient steps until gap_fn(bf16(W)) >= target
    everywhere.  Small, deterministic changes; returns (new bf16-exact W, changed?)."""
    g0 = gap_fn(W0)
    if float(g0.min()) >= target:
        return W0, False
    log(f"    {what}: min gap {float(g0.min()):.3g} < {target:g} on {int((g0 < target).sum())}/{g0.numel()} entries; nudging")
    W = W0.clone().requires_grad_(True)
    scale = float(W0.abs().mean())
    opt = torch.optim.Adam([W], lr=2e-3 * scale)
    for step in range(4000):
        with torch.no_grad():
            Wr = _round_bf16(W)
            g = gap_fn(Wr)
            if float(g.min()) >= target:
                rel = float((Wr - W0).norm() / W0.norm())
                log(f"    {what}: min gap {float(g.min()):.3g} after {step} steps, relative change {rel:.2e}")
                return Wr, True
        opt.zero_grad()
        gap = gap_fn(W)
        loss = torch.relu(1.5 * target - gap).sum() / target + 1e-3 * ((W - W0) ** 2).sum() / scale ** 2
        loss.backward()
        opt.step()
    raise AssertionError(f"could not reach the {what} margin {target} (min {float(gap_fn(_round_bf16(W)).min())})")


def tune_margins(model, tap, prompts, k, log_prefix):
    """Make routing and greedy decisions robust (docs/model.md §8: routing is discontinuous).

    Iterate to a fixed point: compute the greedy continuations; layer by layer (a router only changes what
    later layers see), nudge the router weights so that on every token of every prompt + continuation the
    k-th and (k+1)-th expert probabilities differ by >= ROUTER_GAP_TARGET; then nudge lm_head so that the
    top-1/top-2 logit gap at every greedy step is >= LOGIT_GAP_TARGET.  Returns {param name: new tensor}."""
    layers = model.model.layers
    changed_names = set()
    for it in range(40):
        greedy = [run_prompt(model, tap, ids)["greedy_ids"] for _, ids in prompts]
        seqs = [ids + g[:N_GREEDY - 1] for (_, ids), g in zip(prompts, greedy)]
        changed = False
        for li in range(len(layers)):
            X = torch.cat([full_forward(model, tap, s)[2][li][0] for s in seqs])
            gate = layers[li].mlp.gate
            W, ch = _push_margin(gate.weight.data.clone(), lambda W_: _prob_gap(X, W_, k), ROUTER_GAP_TARGET,
                                 f"router layer {li}")
            if ch:
                gate.weight.data.copy_(W)
                changed = True
                changed_names.add(f"model.language_model.layers.{li}.mlp.gate.weight")
        H = []
        for (_, ids), s in zip(prompts, seqs):
            H.append(full_forward(model, tap, s)[1][len(ids) - 1:])
        H = torch.cat(H)
        W, ch = _push_margin(model.lm_head.weight.data.clone(), lambda W_: _logit_gap(H, W_), LOGIT_GAP_TARGET,
                             "lm_head")
        if ch:
            model.lm_head.weight.data.copy_(W)
            changed = True
            changed_names.add("lm_head.weight")
        log(f"{log_prefix} margin pass {it}: changed={changed}")
        if not changed:
            break
    else:
        raise AssertionError("margin tuning did not converge")
    out = {}
    for n in sorted(changed_names):
        if n == "lm_head.weight":
            out[n] = model.lm_head.weight.data.to(torch.bfloat16).clone()
        else:
            li = int(n.split(".")[3])
            out[n] = layers[li].mlp.gate.weight.data.to(torch.bfloat16).clone()
    return out


def f32_short(x) -> float:
    """The shortest decimal that round-trips the float32 value (parse it as f32 to get the exact value)."""
    return float(str(np.float32(x)))


# ---------------------------------------------------------------------------------------------------------------
# Main per-preset pipeline
# ---------------------------------------------------------------------------------------------------------------
def build_preset(name: str) -> dict:
    from tokenizers import Tokenizer
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    t0 = time.time()
    p = PRESETS[name]
    torch.manual_seed(p["seed"])
    N = p["ranks"]
    sids = bt.special_ids(N)
    assert p["vocab_size"] >= N + bt.N_SPECIALS and p["vocab_size"] % 16 == 0
    model_dir = os.path.join(MODELS_DIR, name)
    if os.path.isdir(model_dir):
        shutil.rmtree(model_dir)
    os.makedirs(model_dir)

    # --- config + tokenizer files -------------------------------------------------------------------------------
    cfg = full_config(p, sids)
    dump_json(os.path.join(model_dir, "config.json"), cfg)
    dump_json(os.path.join(model_dir, "generation_config.json"), generation_config(sids))
    dump_json(os.path.join(model_dir, "tokenizer_config.json"), tokenizer_config(sids))
    bt.write_tokenizer_json(os.path.join(model_dir, "tokenizer.json"), max_ranks=N)

    training = p.get("train")
    extra, corpus_text, corpus_facts = [], None, None
    if training:
        corpus_text, held, corpus_facts = tf.corpus(training["heldout_every"])
        extra = tf.heldout_prompts(held, corpus_text, lambda s: bt.reference_encode(s, max_ranks=N),
                                   training["heldout_prompts"], training["heldout_len"])
        corpus_facts["heldout_prompt_topics"] = [key for _, key, _, _ in extra]
    prompts = make_prompts(N, extra)
    hf_tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    texts = {"len20": TEXT_SHORT, "len70": TEXT_LONG, "chat": render_chat(CHAT), "len1": "The"}
    texts.update({name: text for name, _, text, _ in extra})
    for pname, ids in prompts:
        hf_ids = hf_tok.encode(texts[pname], add_special_tokens=False).ids
        assert hf_ids[:len(ids)] == ids, f"tokenizer.json disagrees with encoding({N}) on {pname}"
        assert max(ids) < N + bt.N_SPECIALS

    # --- names/shapes must match what transformers builds from this config (meta device, no memory) -----------
    hf_cfg = Qwen3_5MoeConfig.from_pretrained(model_dir)
    assert hf_cfg.text_config.layer_types == resolved_layer_types(p), hf_cfg.text_config.layer_types
    with torch.device("meta"):
        cg_meta = Qwen3_5MoeForConditionalGeneration(hf_cfg)
    meta_shapes = {k: tuple(v.shape) for k, v in cg_meta.state_dict().items()}
    del cg_meta
    tensors = text_tensors(p)
    text_meta = {k: s for k, s in meta_shapes.items() if not k.startswith("model.visual.")}
    assert {k: tuple(v.shape) for k, v in tensors.items()} == text_meta, \
        sorted(set(text_meta).symmetric_difference(tensors))[:10]
    vision_shapes = {k: s for k, s in meta_shapes.items() if k.startswith("model.visual.")}
    train_facts = None
    if training:
        log(f"[{name}] training {training['steps']} steps on {corpus_facts['train_chars']} chars of {corpus_facts['source']}")
        trained, train_facts = tf.train(p, cfg["text_config"], tensors, causal_lm_names(tensors),
                                        bt.reference_encode(corpus_text, max_ranks=N), training)
        train_facts["corpus"] = corpus_facts
        tensors.update(trained)
        log(f"[{name}] trained: {train_facts}")
    tensors.update(extra_tensors(p, vision_shapes))

    # --- first write, load, tune margins, write the final checkpoint ------------------------------------------
    write_checkpoint(model_dir, p, tensors)
    model = load_text_model(model_dir)
    tap = RouterTap(model)
    tuned = tune_margins(model, tap, prompts, p["topk"], f"[{name}]")
    tap.remove()
    del model
    for n, t in tuned.items():
        assert t.shape == tensors[n].shape and t.dtype == tensors[n].dtype
        tensors[n] = t
    for fn in os.listdir(model_dir):
        if fn.endswith(".safetensors"):
            os.remove(os.path.join(model_dir, fn))
    shards = write_checkpoint(model_dir, p, tensors)
    facts = checkpoint_facts(p, model_dir, shards)

    # --- reference from the files on disk ----------------------------------------------------------------------
    model = load_text_model(model_dir)
    assert_loaded_from_file(model, tensors)
    tap = RouterTap(model)
    V = p["vocab_size"]
    logits_name = f"{name}.logits.f32"
    blobs, offset = [], 0
    out_prompts = []
    router_min_gap, greedy_min_gap, cache_diff = float("inf"), float("inf"), 0.0
    router_order_gap = float("inf")
    distinct = [set() for _ in range(p["layers"])]
    used = [set() for _ in range(p["layers"])]
    logit_std = []
    prompt_logits, greedy_logits = {}, {}
    for pname, ids in prompts:
        r = run_prompt(model, tap, ids)
        prompt_logits[pname] = r["prompt_logits"]
        greedy_logits[pname] = r["greedy_logits"]
        T = len(ids)
        assert r["prompt_logits"].shape == (T, V) and r["greedy_logits"].shape == (N_GREEDY, V)
        assert torch.equal(r["greedy_logits"][0], r["prompt_logits"][-1])
        # sanity of the reference itself: cached decode == no-cache forward over the same tokens
        seq = ids + r["greedy_ids"][:N_GREEDY - 1]
        full_logits, _, full_calls, hidden = full_forward(model, tap, seq)
        diff = float((full_logits[T - 1:] - r["greedy_logits"]).abs().max())
        cache_diff = max(cache_diff, diff)
        assert diff <= CACHE_TOL, f"{name}/{pname}: cached vs no-cache logits differ by {diff}"
        assert torch.equal(full_logits[T - 1:].argmax(-1), r["greedy_logits"].argmax(-1))
        for li in range(p["layers"]):
            ids_full = full_calls[li][1]
            assert torch.equal(ids_full[:T], r["router"][li][0]), f"{name}/{pname}: prompt routing differs"
            assert torch.equal(ids_full[T:], r["greedy_router"][li][0]), f"{name}/{pname}: decode routing differs"
            for row in torch.cat([r["router"][li][0], r["greedy_router"][li][0]]).tolist():
                distinct[li].add(tuple(sorted(row)))
                used[li].update(row)
        for h in hidden:
            assert torch.isfinite(h).all()
            rms = float(h.pow(2).mean(-1).sqrt().max())
            assert rms < 30.0, f"{name}/{pname}: residual rms {rms} too large"
        assert len(set(r["greedy_ids"])) >= 3, f"{name}/{pname}: degenerate greedy {r['greedy_ids']}"
        assert all(g < N + bt.N_SPECIALS for g in r["greedy_ids"]), "greedy picked a padding row"
        logit_std.append(float(r["prompt_logits"][:, :N + bt.N_SPECIALS].std(dim=-1).mean()))
        router_min_gap = min(router_min_gap, r["router_min_gap"])
        router_order_gap = min(router_order_gap, r["router_order_gap"])
        greedy_min_gap = min(greedy_min_gap, r["greedy_min_gap"])

        def fileref(t):
            nonlocal offset
            b = t.contiguous().numpy().astype("<f4").tobytes()
            ref = {"path": logits_name, "offset": offset, "shape": list(t.shape)}
            blobs.append(b)
            offset += len(b)
            return ref

        def rows(pairs):
            return [{"ids": [[int(x) for x in row] for row in ids_.tolist()],
                     "weights": [[f32_short(x) for x in row] for row in w_.numpy()]} for ids_, w_ in pairs]

        out_prompts.append({
            "name": pname,
            "input_ids": [int(x) for x in ids],
            "prompt_logits_file": fileref(r["prompt_logits"]),
            "greedy_ids": r["greedy_ids"],
            "greedy_logits_file": fileref(r["greedy_logits"]),
            "router": rows(r["router"]),
            "greedy_router": rows(r["greedy_router"]),
        })
        log(f"[{name}] {pname}: T={T} greedy={r['greedy_ids']} cache_diff={diff:.2e} "
            f"router_gap={r['router_min_gap']:.2e} greedy_gap={r['greedy_min_gap']:.3f}")

    # --- independent implementation of docs/model.md §4 (float64 = exact math, float32 = what a plain fp32 engine
    #     computes) agrees: logits within SPEC_TOL and every routing / greedy decision identical ----------------
    spec_diff = {}
    for dt in (np.float64, np.float32):
        spec = SpecModel(model_dir, dtype=dt)
        worst = 0.0
        for (pname, ids), pr in zip(prompts, out_prompts):
            T = len(ids)
            seq = ids + pr["greedy_ids"][:N_GREEDY - 1]
            lg, routes = spec.forward(seq)
            lg = lg.astype(np.float64)
            d1 = float(np.abs(lg[:T] - prompt_logits[pname].double().numpy()).max())
            d2 = float(np.abs(lg[T - 1:] - greedy_logits[pname].double().numpy()).max())
            worst = max(worst, d1, d2)
            tag = f"{name}/{pname} ({np.dtype(dt).name} spec)"
            assert max(d1, d2) <= SPEC_TOL, f"{tag}: spec vs transformers logits differ by {max(d1, d2)}"
            assert lg[T - 1:].argmax(-1).tolist() == pr["greedy_ids"], f"{tag}: greedy differs"
            for li in range(p["layers"]):
                rid = routes[li][0].tolist()
                assert rid[:T] == pr["router"][li]["ids"], f"{tag} layer {li}: prompt routing differs"
                assert rid[T:] == pr["greedy_router"][li]["ids"], f"{tag} layer {li}: decode routing differs"
        spec_diff[np.dtype(dt).name] = worst
        log(f"[{name}] {np.dtype(dt).name} spec implementation vs transformers fp32: max |logit diff| {worst:.2e}")
        del spec

    # --- quality checks ------------------------------------------------------------------------------------------
    for li in range(p["layers"]):
        assert len(distinct[li]) >= 8, f"{name} layer {li}: only {len(distinct[li])} distinct expert sets"
        assert len(used[li]) >= (3 * p["experts"]) // 4, f"{name} layer {li}: only {len(used[li])} experts used"
    assert router_min_gap >= ROUTER_GAP_MIN, f"{name}: router_min_gap {router_min_gap}"
    assert router_order_gap >= ROUTER_GAP_MIN, f"{name}: router order gap {router_order_gap}"
    assert greedy_min_gap >= LOGIT_GAP_MIN, f"{name}: greedy_min_gap {greedy_min_gap}"
    assert 1.0 <= min(logit_std) and max(logit_std) <= 10.0, f"{name}: logit std {logit_std}"

    # --- the nested checkpoint also loads in the conditional-generation class and gives the same logits --------
    cg, info = Qwen3_5MoeForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True, local_files_only=True)
    assert not any(info.values()), f"conditional-generation class did not load cleanly: {info}"
    cg.eval()
    ids20 = dict(prompts)["len20"]
    with torch.no_grad():
        cg_logits = cg(input_ids=torch.tensor([ids20])).logits[0].float()
    cg_diff = float((cg_logits - prompt_logits["len20"]).abs().max())
    assert cg_diff <= CG_TOL, f"{name}: conditional-generation vs causal-LM logits differ by {cg_diff}"
    del cg

    os.makedirs(REF_DIR, exist_ok=True)
    with open(os.path.join(REF_DIR, logits_name), "wb") as fh:
        for b in blobs:
            fh.write(b)
    import transformers

    ref = {
        "dtype": "float32",
        "implementation": f"transformers {transformers.__version__} / torch {torch.__version__.split('+')[0]}",
        "preset": name,
        "seed": p["seed"],
        "model_dir": f"../models/{name}",
        "checkpoint_facts": facts,
        "margins": {"router_min_gap": f32_short(router_min_gap), "greedy_min_gap": f32_short(greedy_min_gap)},
        "prompts": out_prompts,
    }
    if train_facts:
        ref["training"] = train_facts
    with open(os.path.join(REF_DIR, f"{name}.json"), "w") as fh:
        json.dump(ref, fh, separators=(",", ":"))
        fh.write("\n")
    summary = dict(preset=name, cache_diff=cache_diff, cg_diff=cg_diff, spec_diff=spec_diff,
                   router_min_gap=router_min_gap,
                   router_order_gap=router_order_gap,
                   greedy_min_gap=greedy_min_gap, logit_std=logit_std,
                   distinct_sets=[len(s) for s in distinct], seconds=round(time.time() - t0, 1))
    log(f"[{name}] done: {summary}")
    return summary


def sha256_tree(paths) -> dict:
    out = {}
    for root in paths:
        for dp, _, fns in os.walk(root):
            for fn in sorted(fns):
                fp = os.path.join(dp, fn)
                out[os.path.relpath(fp, FIXTURES)] = hashlib.sha256(open(fp, "rb").read()).hexdigest()
    return dict(sorted(out.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS), help="preset(s) to build (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(TORCH_THREADS)
    torch.use_deterministic_algorithms(True)
    names = args.preset or list(PRESETS)
    summaries = [build_preset(n) for n in names]
    total = 0
    for root in (MODELS_DIR, REF_DIR):
        for dp, _, fns in os.walk(root):
            total += sum(os.path.getsize(os.path.join(dp, fn)) for fn in fns)
    log(f"fixtures total (models + reference): {total} bytes")
    print(json.dumps({"summaries": summaries, "fixture_bytes": total}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
