#!/usr/bin/env python3
"""Compare sluice's logits with llama.cpp's on the same GGUF (bench/peers/gguf-parity.sh).

Reads llama_logits' f32 file and greedy ids, and `hostd eval`'s JSON and logits file, for one
prompt of P ids and N greedy steps. Reports, over the P prompt positions and the N greedy
steps: whether the greedy ids are identical, top-1 agreement at the prompt positions, the KL
divergence KL(llama.cpp || sluice) of the next-token distributions (mean, median, max, in
nats), and the largest |Δlogit|. Writes one JSON object to stdout.

With REFERENCE.json (`hostd eval` of the unquantized checkpoint the GGUF was made from, BF16
experts), also how far each side is from it: KL(reference || llama.cpp) and
KL(reference || sluice) over the prompt positions, where both are fed the same ids.

Usage: gguf_parity.py LLAMA.f32 LLAMA_IDS.txt SLUICE.json P N VOCAB [REFERENCE.json]
"""
import json
import sys

import numpy as np


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def main():
    llama_f32, llama_ids, sluice_json, p, n, vocab = sys.argv[1:7]
    reference_json = sys.argv[7] if len(sys.argv) > 7 else None
    p, n, vocab = int(p), int(n), int(vocab)
    theirs = np.fromfile(llama_f32, dtype="<f4").reshape(p + n, vocab)
    their_ids = [int(t) for t in open(llama_ids).read().split()]
    def eval_logits(path):
        doc = json.load(open(path))
        prompt = doc["prompts"][0]
        base = path.rsplit("/", 1)[0] if "/" in path else "."

        def block(b):
            # The oracle's schema: {"path", "offset" (bytes), "shape"}.
            count = int(np.prod(b["shape"]))
            return np.fromfile(f"{base}/{b['path']}", dtype="<f4", count=count, offset=b["offset"]).reshape(-1, vocab)

        return prompt, block(prompt["prompt_logits_file"]), block(prompt["greedy_logits_file"])

    prompt, ours_prompt, ours_greedy = eval_logits(sluice_json)
    assert ours_prompt.shape[0] == p and ours_greedy.shape[0] == n, (ours_prompt.shape, ours_greedy.shape)
    ours = np.concatenate([ours_prompt, ours_greedy])
    lt, lo = log_softmax(theirs), log_softmax(ours)
    kl = (np.exp(lt) * (lt - lo)).sum(axis=-1)
    their_top, our_top = theirs[:p].argmax(-1), ours[:p].argmax(-1)
    top1 = (their_top == our_top).mean()
    # Where the top-1 differs: how far apart llama.cpp itself puts the two candidates (a near
    # tie of a random-weight model's flat distribution, or a real difference).
    flips = [
        {"position": int(i), "llamacpp_gap": float(theirs[i, their_top[i]] - theirs[i, our_top[i]]),
         "sluice_gap": float(ours[i, our_top[i]] - ours[i, their_top[i]])}
        for i in np.nonzero(their_top != our_top)[0]
    ]
    steps = next((i for i, (a, b) in enumerate(zip(their_ids, prompt["greedy_ids"])) if a != b), len(their_ids))
    # Rows compared: the P prompt positions, then greedy steps 1..=steps (step 0's row repeats the
    # last prompt position; steps past the first differing id are fed different ids).
    rows = np.r_[0:p, p + 1:p + min(steps + 1, n)]
    out = {
        "prompt_tokens": p,
        "greedy_steps": n,
        "greedy_ids_identical": their_ids == prompt["greedy_ids"],
        "greedy_ids_llamacpp": their_ids,
        "greedy_ids_sluice": prompt["greedy_ids"],
        "greedy_steps_identical_before_first_difference": steps,
        "prompt_top1_agreement": float(top1),
        "prompt_top1_differences": flips,
        "kl_nats": {
            "what": "KL(llama.cpp || sluice) of the next-token distribution at the P prompt positions (same ids fed to both) and at the greedy steps up to and including the first differing greedy id (after it the two are fed different ids)",
            "rows": int(len(rows)),
            "mean": float(kl[rows].mean()),
            "median": float(np.median(kl[rows])),
            "max": float(kl[rows].max()),
        },
        "max_abs_logit_diff_prompt": float(np.abs(theirs[:p] - ours[:p]).max()),
        "logit_std_llamacpp_prompt": float(theirs[:p].std()),
    }
    if reference_json:
        _, ref_prompt, _ = eval_logits(reference_json)
        lr = log_softmax(ref_prompt)
        kl_ref = lambda l: (np.exp(lr) * (lr - l[:p])).sum(axis=-1)
        out["vs_unquantized_reference"] = {
            "what": "KL(reference || each) at the prompt positions; reference = hostd eval of the BF16 checkpoint the GGUF was made from, BF16 experts (the exact path)",
            "kl_mean_llamacpp": float(kl_ref(lt).mean()),
            "kl_mean_sluice": float(kl_ref(lo).mean()),
            "top1_agreement_llamacpp": float((ref_prompt.argmax(-1) == their_top).mean()),
            "top1_agreement_sluice": float((ref_prompt.argmax(-1) == our_top).mean()),
        }
    json.dump(out, sys.stdout, indent=1)
    print()


main()
