#!/usr/bin/env bash
# Long-context measurements (issue 17 item 3), one harness run:
#   1. The attention core at the real head shape (16 q heads, 2 KV heads, head_dim 256), tiled
#      (model::causal) against the naive per-(token, head) reference it replaced, each case one
#      fresh process, tiled and naive interleaved, ROUNDS rounds: prefill of T tokens in 512-token
#      blocks, and decode steps at depth D. The naive 32k prefill is skipped (~15 min a run).
#   2. hostd bench end to end, resident INT8 (dense + experts in-process), on a real-dimension
#      checkpoint (default: 4 layers D D D A, 8 experts per layer so it is small; each token still
#      runs top-8): prefill of 8k and 32k synthetic tokens in --prefill-chunk blocks, decode at that
#      depth, peak RSS, fresh process per run.
# Results: $OUT/attention.jsonl, $OUT/e2e-8k.json, $OUT/e2e-32k.json, $OUT/meta.txt; summarise with
# bench/longctx_summary.py $OUT. ~45 minutes on the project's 2-core VM.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
LAYERS=${LAYERS:-4}
EXPERTS=${EXPERTS-8}
MODEL=${MODEL:-/tmp/rd${LAYERS}e${EXPERTS}}
CONTAINER=${CONTAINER:-${MODEL}c}
ROUNDS=${ROUNDS:-3}
RUNS_8K=${RUNS_8K:-3}
RUNS_32K=${RUNS_32K:-1}
NEW=${NEW_TOKENS:-16}
CHUNK=${PREFILL_CHUNK:-512}
OUT=${OUT:-$REPO/docs/results/longctx}
BIN=${BENCH_BIN:-/tmp/sluice-longctx-bin}
mkdir -p "$OUT"

(cd "$REPO" && cargo build --release --locked -p hostd -p expertd --bins >&2)
micro=$(cd "$REPO" && cargo bench --locked -p hostd --bench attention_core --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "attention_core" and m.get("executable"):
        print(m["executable"])')
snapshot_bins "$BIN" "$micro"
micro="$BIN/$(basename "$micro")"
ensure_fixture "$BIN"

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git -C "$REPO" rev-parse HEAD)$([ -z "$(git -C "$REPO" status --porcelain -- . ':!docs')" ] || echo ' (+uncommitted or untracked changes)')"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
    echo "cores: $(nproc), threads: $THREADS, prefill chunk: $CHUNK"
    echo "model: $MODEL (realdim, $LAYERS layers, ${EXPERTS:-256} experts), container: $CONTAINER"
    echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    sha256sum "$BIN"/*
} >"$OUT/meta.txt"

# 1. Attention core A/B.
: >"$OUT/attention.jsonl"
for round in $(seq "$ROUNDS"); do
    for case in "prefill 2048" "prefill 8192" "decode 8192" "decode 32768"; do
        for kernel in tiled naive; do
            RAYON_NUM_THREADS=$THREADS "$micro" "$kernel" $case | sed "s/^{/{\"round\":$round,/" >>"$OUT/attention.jsonl"
        done
    done
    RAYON_NUM_THREADS=$THREADS "$micro" tiled prefill 32768 | sed "s/^{/{\"round\":$round,/" >>"$OUT/attention.jsonl"
    tail -n 9 "$OUT/attention.jsonl" >&2
done

# 2. End to end, resident INT8.
config="int8: --dense int8 --experts int8 --container $CONTAINER"
"$BIN/hostd" bench --model "$MODEL" --config "$config" --threads "$THREADS" --runs "$RUNS_8K" \
    --prompt-tokens 8192 --prefill-chunk "$CHUNK" --new-tokens "$NEW" --odirect-bytes 0 --json "$OUT/e2e-8k.json"
"$BIN/hostd" bench --model "$MODEL" --config "$config" --threads "$THREADS" --runs "$RUNS_32K" \
    --prompt-tokens 32768 --prefill-chunk "$CHUNK" --new-tokens "$NEW" --odirect-bytes 0 --json "$OUT/e2e-32k.json"
echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/meta.txt"
python3 "$HERE/longctx_summary.py" "$OUT"
