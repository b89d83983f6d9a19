#!/usr/bin/env bash
# tests/fixtures/gguf/tiny-llamacpp-bf16.gguf: the `tiny` fixture checkpoint converted by
# llama.cpp's own convert_hf_to_gguf.py (the version bench/peers/build-llama.sh vendors,
# 0c1e570), BF16, without the MTP layer — an independent writer of the qwen35moe layout (tensor
# names, ggml shapes, metadata keys, the gate/up split) for tests/it/gguf_prepare.rs and the
# GGUF config reader. The converter's output is deterministic (same bytes on every run).
# Needs bench/peers/build-llama.sh and the converter venv (bench/peers/gguf-q4km.sh or
# convert.sh make it). 788 KB.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
W=${PEERS_WORK:-/tmp/peers}
OUT=$REPO/tests/fixtures/gguf/tiny-llamacpp-bf16.gguf
[ -x "$W/venv/bin/python" ] || { echo "no converter venv in $W (run bench/peers/gguf-q4km.sh)" >&2; exit 2; }
"$W/venv/bin/python" "$REPO/bench/peers/convert_synth.py" "$W/llama.cpp" "$REPO/tests/fixtures/models/tiny" \
  --no-mtp --outtype bf16 --outfile "$OUT.tmp" > "$W/convert-tiny.log" 2>&1 || { tail -20 "$W/convert-tiny.log"; exit 1; }
mv "$OUT.tmp" "$OUT"
sha256sum "$OUT"
