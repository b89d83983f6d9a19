#!/usr/bin/env bash
# The expert boundary at the real model's depth (issue 12), one harness run on the 40-layer
# realdim checkpoint (real per-layer shapes, 32 experts per layer, top-8):
#   1. per-call round trip against one daemon (full cache): `hostd rtt`, 3 fresh client
#      processes per cell: echo (transport only) and a real 1-row top-8 call, over the call
#      ring, the MoeLayer RPC with shared memory, and the RPC inline.
#   2. hostd bench, warm, full cache, INT8 dense: in-process INT8 vs expertd over the ring vs
#      the design before the ring (RPC, no hits-while-reading overlap), fresh process per run,
#      interleaved, drift check.
#   3. hostd bench --cold, cache = 10% of the expert bytes: the old design vs the ring without
#      prefetch hints vs the ring as it runs by default (prefetch hints on: the budget streams) (page cache
#      dropped before every run, O_DIRECT, physical reads, a storage probe before each run).
# Needs root (drop_caches). Writes $OUT/{meta.txt,rtt.jsonl,resident.json,streaming.json}.
# PARTS (default "1 2 3") picks the parts to run; RUNS (default 3) rounds per config, COLD_RUNS
# (default RUNS) for part 3.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
LAYERS=40
MODEL=${MODEL:-/tmp/rd40}
CONTAINER=${CONTAINER:-/tmp/rd40c}
EXPERTS=${EXPERTS:-32}
RUNS=${RUNS:-3}
COLD_RUNS=${COLD_RUNS:-$RUNS}
PROMPT=${PROMPT_TOKENS:-64}
NEW=${NEW_TOKENS:-32}
COLD_NEW=${COLD_NEW_TOKENS:-16}
OUT=${OUT:-$REPO/docs/results/boundary40}
PARTS=${PARTS:-1 2 3}
part() { [[ " $PARTS " == *" $1 "* ]]; }
BIN=${BENCH_BIN:-/tmp/sluice-bench-bin}
start_run
{
  start_meta
  echo "model: $MODEL ($(du -sb "$MODEL" | cut -f1) bytes), container: $CBYTES bytes, cache 10%: $TENTH bytes"
  sha256sum "$BIN/hostd" "$BIN/expertd"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
  echo "parts: $PARTS, rounds: $RUNS (part 3: $COLD_RUNS)"
  echo "loadavg at start: $(cat /proc/loadavg)"
} > "$OUT/meta.txt"
cat "$MODEL"/*.safetensors "$CONTAINER/experts.sluice" > /dev/null

if part 1; then
echo "== 1. per-call round trip"
SOCK=$(mktemp -d)/expertd.sock
"$BIN/expertd" serve --container "$CONTAINER" --socket "$SOCK" --cache-bytes "$CBYTES" 2> "$OUT/rtt-expertd.log" &
DPID=$!
trap 'kill $DPID 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
: > "$OUT/rtt.jsonl"
for cell in "--op echo" "--op moe --top-k 8" "--op moe --top-k 8 --no-ring" "--op moe --top-k 8 --no-shm"; do
  for _ in 1 2 3; do
    # shellcheck disable=SC2086
    "$BIN/hostd" rtt --expertd "unix://$SOCK" --container "$CONTAINER" $cell --calls 3000 --warmup 300 >> "$OUT/rtt.jsonl"
  done
done
kill $DPID; wait $DPID 2>/dev/null || true; trap - EXIT
fi

if part 2; then
echo "== 2. resident (warm, full cache)"
"$BIN/hostd" bench --model "$MODEL" --threads "$THREADS" --runs "$RUNS" --prompt-tokens "$PROMPT" --new-tokens "$NEW" \
  --config "int8: --dense int8 --experts int8 --container $CONTAINER" \
  --config "expertd-ring: --dense int8 --experts expertd --container $CONTAINER --expertd-cache-bytes $CBYTES" \
  --config "expertd-old: --dense int8 --experts expertd --container $CONTAINER --expertd-cache-bytes $CBYTES --expertd-no-ring --expertd-daemon-arg=--no-overlap" \
  --json "$OUT/resident.json"
fi

if part 3; then
echo "== 3. streaming, cache = 10% of the expert bytes, cold"
"$BIN/hostd" bench --model "$MODEL" --threads "$THREADS" --runs "$COLD_RUNS" --prompt-tokens "$PROMPT" --new-tokens "$COLD_NEW" --cold \
  --config "stream-old: --dense int8 --experts expertd --container $CONTAINER --expertd-cache-bytes $TENTH --expertd-no-ring --expertd-daemon-arg=--no-overlap" \
  --config "stream-ring: --dense int8 --experts expertd --container $CONTAINER --expertd-cache-bytes $TENTH --expertd-prefetch off" \
  --config "stream-ring-prefetch: --dense int8 --experts expertd --container $CONTAINER --expertd-cache-bytes $TENTH" \
  --json "$OUT/streaming.json"
fi
echo "loadavg at end: $(cat /proc/loadavg)" >> "$OUT/meta.txt"
echo "done: $OUT"
