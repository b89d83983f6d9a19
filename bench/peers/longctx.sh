#!/usr/bin/env bash
# Long context beside llama.cpp, in rounds on the same machine: per round one fresh
# `hostd profile` process (a LEN-token prompt in chunks of 512, then DECODE greedy steps at that
# depth; resident INT8 dense + experts, no warm-up pass), then llama-bench's prefill of LEN tokens
# from an empty context (`-p LEN -n 0`), then its decode at depth LEN (`-p 0 -n DECODE -d LEN`;
# llama-bench fills the context untimed first). One repetition each, 2 threads, flash attention
# on (its long-context setting; PEERS_ARGS adds knobs). Run convert.sh first. Raw outputs to OUT.
# llama-bench warms up with a full untimed copy of its prefill test; NO_WARMUP=1 passes
# --no-warmup to both llama-bench calls (at 32k that saves ~30 min per round; sluice's run never
# has a warm-up pass).
#
#   MODEL=/tmp/rd40 CONTAINER=/tmp/rd40c PEERS_WORK=/work/peers LEN=8192 ROUNDS=1 bench/peers/longctx.sh
set -euo pipefail
MODEL=${MODEL:-/tmp/rd40}
source "$(dirname "$0")/env.sh"
CONTAINER=${CONTAINER:-${MODEL}c}
LEN=${LEN:-8192}
DECODE=${DECODE:-16}
ROUNDS=${ROUNDS:-1}
THREADS=${THREADS:-2}
HOSTD=${HOSTD:-$REPO/target/release/hostd}
OUT=${OUT:-$REPO/docs/results/longctx40/peers-$LEN}
read -r -a EXTRA <<< "${PEERS_ARGS:--fa on}"
if [ "${NO_WARMUP:-0}" = 1 ]; then EXTRA+=(--no-warmup); fi
mkdir -p "$OUT"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$REPO" rev-parse HEAD)$(git -C "$REPO" diff --quiet || echo ' (dirty)')"
  echo "hostd: $HOSTD sha256 $(sha256sum "$HOSTD" | cut -d' ' -f1)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), nproc $(nproc)"
  echo "model: $MODEL; container: $CONTAINER; gguf: $GGUF ($(stat -c %s "$GGUF") bytes)"
  echo "len: $LEN; decode steps: $DECODE; threads: $THREADS; llama-bench extra: ${EXTRA[*]}"
  sed 's/^/llama: /' "$W/llama-version.txt"
} > "$OUT/meta.txt"
stamp() { echo "$1 $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"; }
for r in $(seq 1 "$ROUNDS"); do
  stamp "round $r sluice start"
  "$HOSTD" profile --model "$MODEL" --dense int8 --experts int8 --container "$CONTAINER" --threads "$THREADS" \
    --prompt-tokens "$LEN" --prefill-chunk 512 --decode-steps "$DECODE" --no-warmup \
    --out "$OUT/sluice-r$r.json" > "$OUT/sluice-r$r.txt" 2>&1
  stamp "round $r llama prefill start"
  "$BENCH" -m "$GGUF" -t "$THREADS" -r 1 -p "$LEN" -n 0 -o json "${EXTRA[@]}" > "$OUT/llama-pp-r$r.json" 2> "$OUT/llama-pp-r$r.stderr"
  stamp "round $r llama decode-at-depth start"
  "$BENCH" -m "$GGUF" -t "$THREADS" -r 1 -p 0 -n "$DECODE" -d "$LEN" -o json "${EXTRA[@]}" > "$OUT/llama-tg-r$r.json" 2> "$OUT/llama-tg-r$r.stderr"
  stamp "round $r done"
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    s = json.load(open(f"{out}/sluice-r{r}.json"))
    pp = json.load(open(f"{out}/llama-pp-r{r}.json"))[0]["avg_ts"]
    tg = json.load(open(f"{out}/llama-tg-r{r}.json"))[0]["avg_ts"]
    sp, sd = s["prefill"]["tokens_per_s"], s["decode"]["tokens_per_s"]
    print(f"round {r}: prefill sluice {sp:.2f} llama {pp:.2f} ratio {sp/pp:.2f}; decode at depth sluice {sd:.2f} llama {tg:.2f} ratio {sd/tg:.2f}")
PY
