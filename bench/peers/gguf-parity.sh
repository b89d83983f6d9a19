#!/usr/bin/env bash
# Parity with llama.cpp on the same GGUF (issue 38): for each GGUF given (default: the Q8_0 and
# Q4_K_M GGUFs of MODEL that convert.sh and gguf-q4km.sh make), llama.cpp's logits for one
# prompt of P token ids and N greedy steps (llama_logits.c, built here against bench/peers'
# llama.cpp) against sluice's (`hostd eval --model FILE.gguf`, dense BF16, experts from a
# container `expertd prepare FILE.gguf` writes beside it, in-process). gguf_parity.py reports
# whether the greedy ids are identical, top-1 agreement and KL(llama.cpp || sluice). Writes
# docs/results/gguf-parity-<gguf name>.json (with the commit and machine).
# Usage: bench/peers/gguf-parity.sh [FILE.gguf ...]   (P=64 N=16 THREADS=nproc by default)
set -euo pipefail
MODEL=${MODEL:-/tmp/realdim4}
source "$(dirname "$0")/env.sh"
LC=$W/llama.cpp
P=${P:-64}
N=${N:-16}
THREADS=${THREADS:-$(nproc)}
NAME=$(basename "$MODEL")
(($#)) || set -- "$W/$NAME-q8_0.gguf" "$W/$NAME-q4_k_m.gguf"
REF=${REF:-$MODEL}

gcc -O2 -Wall -I "$LC/include" -I "$LC/ggml/include" "$HERE/llama_logits.c" \
  -L "$LC/build/bin" -lllama -Wl,-rpath,"$LC/build/bin" -o "$W/llama_logits"
PY=$W/venv/bin/python
"$PY" -c 'import numpy' 2>/dev/null || PY=python3

for GGUF in "$@"; do
  base=$(basename "$GGUF" .gguf)
  out=$W/parity-$base${IDS_PROMPT:+-$IDS_PROMPT}
  mkdir -p "$out"
  container=$W/$base-container
  [ -f "$container/experts.sluice" ] || "$REPO/target/release/expertd" prepare "$GGUF" --out "$container" > "$out/prepare.log" 2>&1
  vocab=$("$REPO/target/release/hostd" inspect "$GGUF" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["vocab_size"])')
  if [ -n "${IDS_FROM:-}" ]; then
    # A named prompt of an oracle reference file (IDS_FROM=FILE.json IDS_PROMPT=NAME), P = its length.
    "$PY" -c "import json; p=[p for p in json.load(open('$IDS_FROM'))['prompts'] if p['name']=='$IDS_PROMPT'][0]; print(' '.join(map(str, p['input_ids'])))" > "$out/ids.txt"
    P=$(wc -w < "$out/ids.txt")
  else
    # P ids drawn with a fixed seed from the whole vocabulary, special tokens included.
    "$PY" -c "import random; r=random.Random(38); print(' '.join(str(r.randrange($vocab)) for _ in range($P)))" > "$out/ids.txt"
  fi
  "$PY" -c "import json; ids=[int(t) for t in open('$out/ids.txt').read().split()]; json.dump({'prompts':[{'name':'random','input_ids':ids}]}, open('$out/prompts.json','w'))"
  "$W/llama_logits" "$GGUF" "$out/ids.txt" "$out/llama.f32" "$N" "$THREADS" > "$out/llama-ids.txt" 2> "$out/llama.log"
  "$REPO/target/release/hostd" eval --model "$GGUF" --dense bf16 --experts int8 --container "$container" --threads "$THREADS" \
    --prompts "$out/prompts.json" --new-tokens "$N" --out "$out/sluice.json" 2> "$out/sluice.log"
  # The unquantized checkpoint the GGUF was made from, on the same ids (BF16 experts, exact).
  ref=()
  if [ -f "$REF/config.json" ]; then
    "$REPO/target/release/hostd" eval --model "$REF" --dense bf16 --experts bf16 --threads "$THREADS" \
      --prompts "$out/prompts.json" --new-tokens "$N" --out "$out/reference.json" 2> "$out/reference.log"
    ref=("$out/reference.json")
  fi
  "$PY" "$HERE/gguf_parity.py" "$out/llama.f32" "$out/llama-ids.txt" "$out/sluice.json" "$P" "$N" "$vocab" "${ref[@]}" > "$out/parity.json"
  THREADS=$THREADS W=$W MODEL=$MODEL IDS_FROM=${IDS_FROM:-} IDS_PROMPT=${IDS_PROMPT:-} "$PY" - "$out/parity.json" "$REPO/docs/results/gguf-parity-$base${IDS_PROMPT:+-$IDS_PROMPT}.json" "$GGUF" "$container" <<'EOF'
import json, os, subprocess, sys
r = json.load(open(sys.argv[1]))
report = json.load(open(sys.argv[4] + "/prepare-report.json"))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
doc = {
    "what": "sluice vs llama.cpp logits on the same GGUF: one prompt, then greedy steps",
    "command": " ".join(f"{k}={os.environ[k]}" for k in ("MODEL", "IDS_FROM", "IDS_PROMPT") if os.environ.get(k)) + " bench/peers/gguf-parity.sh " + sys.argv[3],
    "prompt": (f"{os.environ['IDS_PROMPT']} of {os.environ['IDS_FROM']}" if os.environ.get("IDS_FROM") else "random ids, seed 38, over the whole vocabulary"),
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "llama_cpp": open(os.environ["W"] + "/llama-version.txt").read().split("commit ")[-1].split(")")[0],
    "machine": cpu,
    "gguf": sys.argv[3].rsplit("/", 1)[-1],
    "sluice": "hostd eval --model FILE.gguf --dense bf16 --experts int8 (in-process) on the container expertd prepare wrote from the GGUF",
    "threads": int(os.environ["THREADS"]),
    "container_format": report.get("expert_format"),
    "requantized_tensors": len(report.get("requantized", [])),
    **r,
}
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print(json.dumps({k: doc.get(k) for k in ("gguf", "greedy_ids_identical", "greedy_steps_identical_before_first_difference", "prompt_top1_agreement", "prompt_top1_differences", "kl_nats", "max_abs_logit_diff_prompt", "logit_std_llamacpp_prompt", "vs_unquantized_reference")}, indent=1))
EOF
done
