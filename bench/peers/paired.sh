#!/usr/bin/env bash
# sluice vs llama.cpp, paired: ROUNDS rounds, each one fresh `hostd profile` process (resident INT8
# dense + INT8 experts, 512-token prompt, DECODE decode steps) immediately followed by one
# llama-bench process (pp512 and tgDECODE from an empty context, 1 repetition, the sweep's best
# flags), so both sides of a round see the same state of this noisy VM. Ratios are taken per
# round; bench/peers/paired_summary.py reports their median and geometric mean with a 95% interval.
# Needs the 40-layer checkpoint, its container and the GGUF (bench/peers/convert.sh).
set -euo pipefail
MODEL=${MODEL:-/tmp/rd40}
CONTAINER=${CONTAINER:-/tmp/rd40c}
source "$(dirname "$0")/env.sh"
source "$HERE/../lib.sh"
ROUNDS=${ROUNDS:-5}
DECODE=${DECODE:-128}
OUT=${OUT:-$REPO/docs/results/peers/paired-$(basename "$MODEL")}
BIN=${BENCH_BIN:-/tmp/sluice-paired-bin}
PEERS_ARGS=$(best_peers_args)
read -r -a EXTRA <<< "$PEERS_ARGS"
mkdir -p "$OUT"
snapshot_bins "$BIN"
{
  start_meta
  sha256sum "$BIN/hostd"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "threads: $THREADS, rounds: $ROUNDS, decode steps: $DECODE"
  echo "sluice: $BIN/hostd profile --model $MODEL --dense int8 --experts int8 --container $CONTAINER --threads $THREADS --prompt-tokens 512 --decode-steps $DECODE"
  echo "llama: $BENCH -m $GGUF -p 512 -n $DECODE -t $THREADS -r 1 -o json ${PEERS_ARGS:-}"
  echo "loadavg at start: $(cat /proc/loadavg)"
} > "$OUT/meta.txt"
cat "$MODEL"/*.safetensors "$CONTAINER/experts.sluice" "$GGUF" > /dev/null
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS: sluice"
  "$BIN/hostd" profile --model "$MODEL" --dense int8 --experts int8 --container "$CONTAINER" --threads "$THREADS" \
    --prompt-tokens 512 --decode-steps "$DECODE" --out "$OUT/sluice-$r.json" > "$OUT/sluice-$r.log" 2>&1
  echo "round $r/$ROUNDS: llama.cpp"
  "$BENCH" -m "$GGUF" -p 512 -n "$DECODE" -t "$THREADS" -r 1 -o json "${EXTRA[@]}" \
    > "$OUT/llama-$r.json" 2> "$OUT/llama-$r.stderr"
done
echo "loadavg at end: $(cat /proc/loadavg)" >> "$OUT/meta.txt"
python3 "$HERE/paired_summary.py" "$OUT" | tee "$OUT/summary.md"
