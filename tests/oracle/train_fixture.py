#!/usr/bin/env python3
"""Briefly trains a fixture model on English text so that its logits look like a language model's.

The random-weight presets (tiny, small, wide) have flat next-token distributions: their top-1 is
often within 0.1 logit of the top-2, so any perturbation (INT8 weights, a different summation
order) flips it, and a top-1 agreement figure measured on them says more about ties than about
the perturbation. A preset with a `train` entry starts from the same random initialisation
(`make_fixtures.text_tensors`) and is trained for a few hundred AdamW steps on a fixed corpus,
then written and checked exactly like the others (margin tuning, transformers reference, spec
cross-check).

Corpus: the English reference text that ships with CPython (`pydoc_data.topics`, the language
reference sections `help()` shows), its topics in sorted order. The training topics are cut into
documents of four paragraphs and every second one is wrapped as a ChatML conversation (system, user
= its first paragraph, assistant = a `<think>` block with the second paragraph, then the rest), so
the special tokens and the chat template are learnt too (untrained, the chat prompt degenerates into
repeating one token). Every `heldout_every`-th topic is held out of training; the held-out prompts
are taken from those topics (plain text), so they are in-domain text the model has not seen. The
corpus depends on the Python version (recorded, with its sha256, in the reference JSON); training is
deterministic on one machine (fixed seeds, two threads, deterministic algorithms).
"""

from __future__ import annotations

import hashlib
import math
import sys
import time

import torch


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def corpus(heldout_every: int) -> tuple[str, list[str], dict]:
    """(training text, held-out topic texts in order, facts about the corpus)."""
    import pydoc_data.topics as topics

    keys = sorted(topics.topics)
    train = [topics.topics[k] for i, k in enumerate(keys) if i % heldout_every != heldout_every - 1]
    docs = [d for t in train for d in documents(t)]
    train = [as_chat(d) if i % 2 else d for i, d in enumerate(docs)]
    held = [topics.topics[k] for i, k in enumerate(keys) if i % heldout_every == heldout_every - 1]
    text = "\n\n".join(train)
    facts = {
        "source": "pydoc_data.topics (CPython's language reference text)",
        "python": sys.version.split()[0],
        "topics": len(keys),
        "heldout_topics": [k for i, k in enumerate(keys) if i % heldout_every == heldout_every - 1],
        "train_chars": len(text),
        "train_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    return text, held, facts


def documents(topic: str, per_doc: int = 4) -> list[str]:
    """A topic cut into documents of `per_doc` paragraphs."""
    paras = [p for p in topic.split("\n\n") if p.strip()]
    return ["\n\n".join(paras[i:i + per_doc]) for i in range(0, len(paras), per_doc)]


def as_chat(text: str) -> str:
    """One topic as a ChatML conversation in the layout of the chat template (spec §7.3)."""
    paras = [p for p in text.split("\n\n") if p.strip()]
    user, think, answer = paras[0], paras[1] if len(paras) > 1 else "", "\n\n".join(paras[2:])
    return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n<think>\n{think}\n</think>\n\n{answer}<|im_end|>\n")


def heldout_prompts(held: list[str], encode, n_prompts: int, length: int) -> list[tuple[str, str, list]]:
    """(name, text, ids) of `n_prompts` prompts of `length` tokens, one per held-out topic."""
    out = []
    for j, text in enumerate(held[:n_prompts]):
        ids = encode(text)
        assert len(ids) >= length, f"held-out topic {j} has only {len(ids)} tokens"
        out.append((f"heldout{j + 1}", text, ids[:length]))
    return out


def train(p: dict, cfg_dict: dict, tensors: dict, ids: list, train_cfg: dict) -> tuple[dict, dict]:
    """Trains the text model initialised from `tensors` on `ids`; returns (new text tensors in the
    file dtypes, training facts). Only `model.language_model.*` and `lm_head.weight` change."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(**{k: v for k, v in cfg_dict.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(p["seed"])
    model = Qwen3_5MoeForCausalLM(cfg)
    prefix = "model.language_model."
    to_param = {n: ("model." + n[len(prefix):] if n.startswith(prefix) else n)
                for n in tensors if n.startswith(prefix) or n == "lm_head.weight"}
    model.load_state_dict({to_param[n]: tensors[n].float() for n in to_param}, strict=True)
    model.train()

    steps, seq, batch, lr_max = train_cfg["steps"], train_cfg["seq"], train_cfg["batch"], train_cfg["lr"]
    warmup = max(1, steps // 20)
    data = torch.tensor(ids)
    gen = torch.Generator().manual_seed(p["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=lr_max, weight_decay=0.01)
    t0, losses = time.time(), []
    for step in range(steps):
        lr = lr_max * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=gen)
        x = torch.stack([data[s:s + seq] for s in starts.tolist()])
        # loss = next-token cross entropy + router_aux_loss_coef * load-balancing loss
        out = model(input_ids=x, labels=x, output_router_logits=True)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(out.loss))
        if step % 50 == 0 or step == steps - 1:
            log(f"    train step {step}/{steps}: loss {losses[-1]:.3f} lr {lr:.2e} ({time.time() - t0:.0f} s)")

    sd = model.state_dict()
    new = {}
    for n, pn in to_param.items():
        new[n] = sd[pn].detach().to(tensors[n].dtype).contiguous().clone()
    tail = losses[-max(1, steps // 10):]
    facts = dict(train_cfg, tokens=len(ids), final_loss_mean_last_10pct=round(sum(tail) / len(tail), 4),
                 first_loss=round(losses[0], 4), seconds=round(time.time() - t0, 1))
    return new, facts
