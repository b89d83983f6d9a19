#!/usr/bin/env bash
# One harness run for issue 7's targets, sluice and llama.cpp side by side on one machine:
#   1. hostd bench, warm/resident: bf16 (exact), int8 (dense + experts in-process),
#      int8 through a private expertd (full cache) — fresh process per run, A/B/C interleaved,
#      drift check at the end.
#   2. llama-bench pp512/tg128, Q8_0, same threads (bench/peers/run.sh).
#   3. hostd bench --cold: int8 dense + expertd streaming with a cache of 10% of the expert
#      bytes; page cache dropped before every run, O_DIRECT reads, physical reads counted.
#   4. The same streaming bench INSIDE a cgroup whose memory limit is sluice's total peak RSS
#      in (3) (hostd + expertd VmHWM medians), then llama-bench decode under the same limit
#      (GGUF evicted from the page cache first): both bounded by one number.
#   5. Long context when LONGCTX lists lengths (off by default): bench/peers/longctx.sh rounds.
#   6. bench/headline_summary.py: ratios against the targets -> $OUT/headline.{json,md}.
# Needs root (drop_caches, cgroups), /tmp/peers from bench/peers/{build-llama,convert}.sh, the
# realdim checkpoint and its container. ~26 minutes at 40 layers on the project's 2-core Intel VM
# (2026-12-06), plus the long-context rounds.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
# Full depth by default (issue 17): the real per-layer shapes at 40 layers, 32 of the 256 experts per
# layer (top-8 kept, so a token touches the real model's expert bytes); LAYERS=4 EXPERTS= for the old
# 4-layer headline.
LAYERS=${LAYERS:-40}
EXPERTS=${EXPERTS-32}
MODEL=${MODEL:-/tmp/rd$LAYERS}
CONTAINER=${CONTAINER:-/tmp/rd${LAYERS}c}
# Issue 38: GGUF_MODEL=FILE.gguf runs sluice from that file (dense weights, config, tokenizer;
# the experts from the container `expertd prepare FILE.gguf` wrote: CONTAINER_GGUF, default
# FILE-container, made if missing) and llama.cpp on the same file. Configs q4k (--dense int8 --experts int8),
# q4k-expertd and dense-bf16 (--dense bf16) instead of int8, int8-expertd and bf16.
if [ -n "${GGUF_MODEL:-}" ]; then
  CONTAINER=${CONTAINER_GGUF:-${GGUF_MODEL%.gguf}-container}
  MODEL=$GGUF_MODEL
  export GGUF=$GGUF_MODEL
fi
RUNS=${RUNS:-3}
NEW=${NEW_TOKENS:-128}
COLD_NEW=${COLD_NEW_TOKENS:-32}
OUT=${OUT:-$REPO/docs/results/headline}
# llama-bench's raw JSON of this run (not the shared docs/results/peers, so runs on different
# machines keep theirs).
export PEERS_RES=${PEERS_RES:-$OUT/peers}
BIN=${BENCH_BIN:-/tmp/sluice-bench-bin}
start_run
source "$HERE/peers/cgroup.sh"
# llama.cpp at its best (PEERS_ARGS overrides; empty = llama-bench defaults).
PEERS_ARGS=$(best_peers_args)
export PEERS_ARGS
{
  start_meta
  sha256sum "$BIN/hostd" "$BIN/expertd"
  echo "loadavg at start: $(cat /proc/loadavg)"
  echo "llama-bench extra knobs: ${PEERS_ARGS:-(defaults)}"
} > "$OUT/meta.txt"
# Warm the page cache for the resident runs.
warm_model() { if [ -f "$MODEL" ]; then cat "$MODEL"; else cat "$MODEL"/*.safetensors; fi > /dev/null; }
warm_model
cat "$CONTAINER/experts.sluice" > /dev/null

echo "== 1. resident (warm)"
if [ -n "${GGUF_MODEL:-}" ]; then
  RESIDENT=(--config "q4k: --dense int8 --experts int8 --container $CONTAINER"
            --config "q4k-expertd: --dense int8 --experts expertd --container $CONTAINER"
            --config "dense-bf16: --dense bf16 --experts int8 --container $CONTAINER")
else
  RESIDENT=(--config "bf16: --dense bf16 --experts bf16"
            --config "int8: --dense int8 --experts int8 --container $CONTAINER"
            --config "int8-expertd: --dense int8 --experts expertd --container $CONTAINER")
fi
"$BIN/hostd" bench --model "$MODEL" --threads "$THREADS" --runs "$RUNS" --prompt-tokens 512 --new-tokens "$NEW" \
  "${RESIDENT[@]}" --json "$OUT/resident.json"

echo "== 2. llama.cpp pp512 / tg128"
MODEL=$MODEL REPS=$RUNS bash "$HERE/peers/run.sh"
PEER_TAG=llama-bench-$(basename "${GGUF:-$MODEL-q8_0}" .gguf)-t$THREADS

echo "== 3. streaming, cache = 10% of the expert bytes, cold"
"$BIN/hostd" bench --model "$MODEL" --threads "$THREADS" --runs "$RUNS" --prompt-tokens 512 --new-tokens "$COLD_NEW" --cold \
  --config "stream10: --dense int8 --experts expertd --container $CONTAINER --expertd-cache-bytes $TENTH" \
  --json "$OUT/streaming.json"

LIMIT=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["configs"][0]["summary"]; print(int(s["hostd_vm_hwm_bytes"]["median"] + s["expertd_vm_hwm_bytes"]["median"]))' "$OUT/streaming.json")
echo "== 4a. sluice streaming inside a ${LIMIT}-byte cgroup (its own hostd + expertd peak RSS)"
rm -f "$OUT/streaming-bounded.cgroup.txt"
CGROUP_REPORT="$OUT/streaming-bounded.cgroup.txt" run_limited "$BIN/hostd" bench --model "$MODEL" --threads "$THREADS" --runs "$RUNS" --prompt-tokens 512 --new-tokens "$COLD_NEW" --cold \
  --config "stream10: --dense int8 --experts expertd --container $CONTAINER --expertd-cache-bytes $TENTH" \
  --json "$OUT/streaming-bounded.json" || echo "bounded sluice run failed"
echo "== 4b. llama.cpp decode under the same ${LIMIT}-byte cgroup limit"
MODEL=$MODEL PEERS_EVICT=1 PEERS_MEM_LIMIT=$LIMIT PEERS_P=0 PEERS_N="$COLD_NEW" REPS=$RUNS BENCH_TIMEOUT=1500 bash "$HERE/peers/run.sh" || echo "bounded llama-bench failed or timed out"
# Put the model back in the page cache for whoever runs next.
warm_model

# Long context (issue 17), off unless LONGCTX lists lengths, e.g. LONGCTX="8192 32768" (on the
# 2-core VM 8k adds ~15 min, 32k ~70): per length one bench/peers/longctx.sh round, sluice's
# `hostd profile` (LEN-token prompt, LONGCTX_DECODE steps at that depth) then llama.cpp's one
# prefill of the same length through llama-completion, with LONGCTX_PEERS_ARGS (default -fa on:
# llama-bench's decode knobs above are not all llama-completion options).
LONG_ARGS=()
for LEN in ${LONGCTX-}; do
  echo "== 5. long context, $LEN tokens"
  MODEL=$MODEL CONTAINER=$CONTAINER HOSTD=$BIN/hostd LEN=$LEN DECODE=${LONGCTX_DECODE:-16} ROUNDS=1 LLAMA_TOOL=completion \
    PEERS_ARGS="${LONGCTX_PEERS_ARGS:--fa on}" OUT="$OUT/longctx-$LEN" bash "$HERE/peers/longctx.sh"
  LONG_ARGS+=(--longctx "$OUT/longctx-$LEN")
done

echo "== 6. summary"
echo "loadavg at end: $(cat /proc/loadavg)" >> "$OUT/meta.txt"
python3 "$HERE/headline_summary.py" --resident "$OUT/resident.json" --streaming "$OUT/streaming.json" \
  --streaming-bounded "$OUT/streaming-bounded.json" \
  --peer "$PEERS_RES/$PEER_TAG.json" \
  --peer-bounded "$PEERS_RES/$PEER_TAG-mem$LIMIT-p0-n$COLD_NEW.json" ${GGUF_MODEL:+--gguf "$(basename "$GGUF_MODEL")"} \
  --limit-bytes "$LIMIT" ${LONG_ARGS[@]+"${LONG_ARGS[@]}"} --out "$OUT/headline"
