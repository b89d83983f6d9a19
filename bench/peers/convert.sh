#!/usr/bin/env bash
# Convert the synthetic realdim checkpoint to GGUF Q8_0 with the vendored
# convert_hf_to_gguf.py. Run build-llama.sh first. Idempotent.
set -euo pipefail
MODEL=${MODEL:-/tmp/realdim4}
source "$(dirname "$0")/env.sh"
LC=$W/llama.cpp
OUT=$GGUF

if [ ! -f "$MODEL/config.json" ]; then
  if [ -x "$REPO/target/release/hostd" ]; then
    "$REPO/target/release/hostd" synth --preset realdim --layers "${LAYERS:-4}" ${EXPERTS:+--experts "$EXPERTS"} --seed "${SEED:-0}" --out "$MODEL"
  else
    echo "BLOCKED: $MODEL missing and $REPO/target/release/hostd not built" >&2; exit 2
  fi
fi

# Python deps in the converter's own venv (no system packages: a fresh machine has no torch).
# convert_hf_to_gguf.py imports torch unconditionally. PyPI's Linux torch wheel needs its nvidia-*
# runtime packages even on CPU (import fails without libcublasLt), so pip installs them (~3 GB);
# the CPU-only wheel index is not a package registry this project can reach. Versions pinned in
# bench/peers/requirements-convert.txt.
if [ ! -x "$W/venv/bin/python" ] || ! "$W/venv/bin/python" -c 'import torch, transformers, gguf' 2>/dev/null; then
  rm -rf "$W/venv"
  python3 -m venv "$W/venv"
  "$W/venv/bin/pip" install -q -r "$HERE/requirements-convert.txt"
  "$W/venv/bin/pip" install -q --no-deps "$LC/gguf-py"
fi

# The synthetic checkpoint declares mtp_num_hidden_layers: 1 (like the real
# Qwen3.6 config) but stores no mtp.* tensors. Without --no-mtp the converter
# writes block_count = layers + 1 and llama.cpp then fails to load with
# "check_tensor_dims: tensor 'blk.<layers>.attn_norm.weight' not found".
# (Setting mtp_num_hidden_layers: 0 instead trips an assert in conversion/qwen.py.)
# llama-bench does not use the MTP head anyway, so always drop it.
if [ ! -s "$OUT" ]; then
  # convert_synth.py = convert_hf_to_gguf.py + forced "qwen35" pre-tokenizer
  # (the synthetic tokenizer's hash is unknown to llama.cpp; see that file).
  # The converter only writes the text model for *ForConditionalGeneration
  # checkpoints (the mmproj is a separate --mmproj run, not needed here).
  "$W/venv/bin/python" "$HERE/convert_synth.py" "$LC" "$MODEL" --no-mtp --outtype q8_0 --outfile "$OUT.tmp" > "$W/convert.log" 2>&1 || { tail -20 "$W/convert.log"; exit 1; }
  mv "$OUT.tmp" "$OUT"
fi
ls -la "$OUT"
