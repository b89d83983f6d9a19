#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py on sluice's synthetic checkpoint.

The synthetic checkpoint (hostd synth) ships a small BPE tokenizer (1033 tokens)
whose hash is not in llama.cpp's known list, so get_vocab_base_pre() raises
"BPE pre-tokenizer was not recognized". Its pre-tokenizer regex is the Qwen3.5
one, so we force the "qwen35" pre-tokenizer id. Weights are untouched; the
tokenizer does not affect llama-bench (it feeds random token ids).
Usage: convert_synth.py LLAMA_CPP_DIR <convert_hf_to_gguf.py args...>
"""
import runpy
import sys
from pathlib import Path

lc = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(lc))
sys.path.insert(1, str(lc / "gguf-py"))
import conversion.base as base  # noqa: E402

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
script = lc / "convert_hf_to_gguf.py"
sys.argv = [str(script)] + sys.argv[2:]
runpy.run_path(str(script), run_name="__main__")
