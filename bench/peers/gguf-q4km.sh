#!/usr/bin/env bash
# A llama.cpp Q4_K_M GGUF of the synthetic checkpoint MODEL, made the way users make theirs:
# llama.cpp's own converter to BF16 (convert_synth.py, as convert.sh) and then
# `llama-quantize … Q4_K_M`. Run build-llama.sh first; convert.sh's venv is made if missing.
# Writes $W/<model>-bf16.gguf and $W/<model>-q4_k_m.gguf. Idempotent.
set -euo pipefail
MODEL=${MODEL:-/tmp/realdim4}
source "$(dirname "$0")/env.sh"
LC=$W/llama.cpp
NAME=$(basename "$MODEL")
BF16=$W/$NAME-bf16.gguf
Q4KM=$W/$NAME-q4_k_m.gguf

if [ ! -f "$MODEL/config.json" ]; then
  "$REPO/target/release/hostd" synth --preset realdim --layers "${LAYERS:-4}" ${EXPERTS:+--experts "$EXPERTS"} --seed "${SEED:-0}" --out "$MODEL"
fi
if [ ! -x "$W/venv/bin/python" ] || ! "$W/venv/bin/python" -c 'import torch, transformers, gguf' 2>/dev/null; then
  rm -rf "$W/venv"
  python3 -m venv "$W/venv"
  "$W/venv/bin/pip" install -q -r "$HERE/requirements-convert.txt"
  "$W/venv/bin/pip" install -q --no-deps "$LC/gguf-py"
fi
if [ ! -s "$BF16" ]; then
  # --no-mtp: see convert.sh (the synthetic checkpoint declares an MTP layer it does not store).
  "$W/venv/bin/python" "$HERE/convert_synth.py" "$LC" "$MODEL" --no-mtp --outtype bf16 --outfile "$BF16.tmp" > "$W/convert-bf16.log" 2>&1 || { tail -20 "$W/convert-bf16.log"; exit 1; }
  mv "$BF16.tmp" "$BF16"
fi
if [ ! -s "$Q4KM" ]; then
  "$LC/build/bin/llama-quantize" "$BF16" "$Q4KM.tmp" Q4_K_M "$(nproc)" > "$W/quantize-q4km.log" 2>&1 || { tail -20 "$W/quantize-q4km.log"; exit 1; }
  mv "$Q4KM.tmp" "$Q4KM"
fi
ls -la "$BF16" "$Q4KM"
