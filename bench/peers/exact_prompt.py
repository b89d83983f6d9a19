#!/usr/bin/env python3
"""Writes a plain-text prompt that is exactly LEN tokens long in MODEL's tokenizer, for the peers'
long-context runs that take text (llama-completion): seeded random English words, each a
space-led word whose token count `hostd tokenize` reports, topped up with one-token words.

Usage: exact_prompt.py HOSTD MODEL_DIR LEN OUT_FILE [SEED]

The count is additive because the tokenizer's pre-tokenizer splits at the spaces; the script still
tokenizes the whole text once at the end and fails unless it is exactly LEN tokens."""
import random
import subprocess
import sys

WORDS = """time year people way day man thing woman life child world school state family student
group country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book eye job
word business issue side kind head house service friend father power hour game line end member law
car city community name president team minute idea kid body information back parent face others
level office door health person art war history party result change morning reason research girl
guy moment air teacher force education foot boy age policy music market sense nation plan college
interest death experience effect use class control care field development role effort rate heart
show leader light voice wife police mind price report decision son view relationship town road arm
difference value building action model season society tax director position player record paper
space ground form event official matter center couple site project activity star table need court
oil situation cost industry figure street image phone data picture practice piece land product
doctor wall patient worker news test movie north love support technology step baby computer type
attention film tree source organization hair window evidence population truth theory""".split()


def count(hostd: str, model: str, text: str) -> int:
    ids = subprocess.run([hostd, "tokenize", "--model", model], input=text.encode(), capture_output=True, check=True).stdout.split()
    return len(ids)


def main() -> None:
    hostd, model, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rng = random.Random(int(sys.argv[5]) if len(sys.argv) > 5 else 1)
    cost = {w: count(hostd, model, " " + w) for w in WORDS}
    ones = [w for w, c in cost.items() if c == 1]
    if not ones:
        sys.exit("exact_prompt: no word of the list is a single token in this tokenizer")
    words, total = [], 0
    while n - total > max(cost.values()):
        w = rng.choice(WORDS)
        words.append(w)
        total += cost[w]
    while total < n:
        w = rng.choice(ones)
        words.append(w)
        total += 1
    text = "".join(" " + w for w in words)
    got = count(hostd, model, text)
    if got != n:
        sys.exit(f"exact_prompt: the text is {got} tokens, not {n} (the per-word counts did not add up)")
    with open(out, "w") as f:
        f.write(text)
    print(f"exact_prompt: {out}: {len(words)} words, {got} tokens")


if __name__ == "__main__":
    main()
