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
repeating one token). Every `heldout_every`-th topic is held out of training; the held-out prompts come from
held-out topics whose prompt text shares no 48-character run with the training text (topics
overlap: `class` is repeated inside `compound`, so holding a topic out is not enough), so they are
in-domain text the model has not seen. The corpus depends on the Python version (recorded, with
its sha256, in the reference JSON). Training is deterministic on one machine: fixed seeds, and
`make_fixtures.main` sets two threads and deterministic algorithms (asserted here); a rerun wrote
byte-identical files.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time

import torch


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def corpus(heldout_every: int) -> tuple[str, list[tuple[str, str]], dict]:
    """(training text, held-out (topic key, text) pairs in order, facts about the corpus)."""
    import pydoc_data.topics as topics

    keys = sorted(topics.topics)
    is_held = lambda i: i % heldout_every == heldout_every - 1  # noqa: E731
    docs = [d for i, k in enumerate(keys) if not is_held(i) for d in documents(topics.topics[k])]
    text = "\n\n".join(as_chat(d) if j % 2 else d for j, d in enumerate(docs))
    held = [(k, topics.topics[k]) for i, k in enumerate(keys) if is_held(i)]
    facts = {
        "source": "pydoc_data.topics (CPython's language reference text)",
        "python": sys.version.split()[0],
        "topics": len(keys),
        "heldout_topics": [k for k, _ in held],
        "train_chars": len(text),
        "train_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    return text, held, facts


def documents(topic: str, per_doc: int = 4) -> list[str]:
    """A topic cut into documents of `per_doc` paragraphs."""
    paras = [p for p in topic.split("\n\n") if p.strip()]
    return ["\n\n".join(paras[i:i + per_doc]) for i in range(0, len(paras), per_doc)]


def as_chat(text: str) -> str:
    """One topic as a ChatML conversation in the layout of the chat template (docs/model.md §7.3)."""
    paras = [p for p in text.split("\n\n") if p.strip()]
    user, think, answer = paras[0], paras[1] if len(paras) > 1 else "", "\n\n".join(paras[2:])
    return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n<think>\n{think}\n</think>\n\n{answer}<|im_end|>\n")


def heldout_prompts(held: list[tuple[str, str]], train_text: str, encode, n_prompts: int,
                    length: int) -> list[tuple[str, str, str, list]]:
    """(name, topic key, text, ids) of `n_prompts` prompts of `length` tokens from held-out topics whose prompt
    text shares no `UNSEEN_WINDOW`-character run with the training text.

    Holding a topic out is not enough: CPython's topics overlap (`class` is repeated almost word
    for word inside `compound`), so a held-out topic can still be training text. Topics whose
    prompt span overlaps are skipped (and named in the log)."""
    windows = {train_text[i:i + UNSEEN_WINDOW] for i in range(len(train_text) - UNSEEN_WINDOW + 1)}
    out = []
    for key, text in held:
        ids = encode(text)
        if len(ids) < length:
            log(f"    held-out topic {key!r}: only {len(ids)} tokens, skipped")
            continue
        span = next(text[:n] for n in range(length, len(text) + 1) if len(encode(text[:n])) >= length)
        seen = sum(span[i:i + UNSEEN_WINDOW] in windows for i in range(len(span) - UNSEEN_WINDOW + 1))
        if seen:
            log(f"    held-out topic {key!r}: {seen} {UNSEEN_WINDOW}-char runs of its prompt are in the training text, skipped")
            continue
        out.append((f"heldout{len(out) + 1}", key, text, ids[:length]))
        log(f"    held-out prompt {out[-1][0]}: topic {key!r} ({len(span)} chars, no run shared with training)")
        if len(out) == n_prompts:
            return out
    raise AssertionError(f"only {len(out)} of {n_prompts} held-out topics are unseen")


# A prompt counts as unseen when none of its runs of this many characters occurs in the training text.
UNSEEN_WINDOW = 48


def train(p: dict, cfg_dict: dict, tensors: dict, to_param: dict, ids: list, train_cfg: dict) -> tuple[dict, dict]:
    """Trains the text model initialised from `tensors` on `ids`; returns (new text tensors in the
    file dtypes, training facts). `to_param` maps each text tensor's file name to its parameter name
    (`make_fixtures.causal_lm_names`); only those tensors change."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    assert torch.are_deterministic_algorithms_enabled() and torch.get_num_threads() == 2, \
        "make_fixtures.main sets deterministic algorithms and 2 threads; training relies on both"
    cfg = Qwen3_5MoeTextConfig(**{k: v for k, v in cfg_dict.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(p["seed"])
    model = Qwen3_5MoeForCausalLM(cfg)
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
        starts = torch.randint(0, len(ids) - seq + 1, (batch,), generator=gen)
        x = torch.stack([data[s:s + seq] for s in starts.tolist()])
        # loss = next-token cross entropy + router_aux_loss_coef * load-balancing loss
        out = model(input_ids=x, labels=x, output_router_logits=True)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.item())
        if step % 50 == 0 or step == steps - 1:
            log(f"    train step {step}/{steps}: loss {losses[-1]:.3f} lr {lr:.2e} ({time.time() - t0:.0f} s)")

    sd = model.state_dict()
    new = {}
    for n, pn in to_param.items():
        new[n] = sd[pn].detach().to(tensors[n].dtype).contiguous().clone()
    tail = losses[-max(1, steps // 10):]
    # No wall-clock time in the facts: they go into the reference JSON, which must be byte-identical on a rerun.
    facts = dict(train_cfg, tokens=len(ids), epochs=round(steps * batch * seq / len(ids), 2),
                 objective="next-token cross entropy + router_aux_loss_coef x load-balancing loss",
                 first_objective=round(losses[0], 4),
                 final_objective_mean_last_10pct=round(sum(tail) / len(tail), 4))
    log(f"    trained in {time.time() - t0:.0f} s")
    return new, facts
