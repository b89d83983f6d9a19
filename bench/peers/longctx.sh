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
# LLAMA_TOOL=completion measures llama.cpp with ONE prefill instead of two: llama-completion
# on a plain-text prompt of exactly LEN tokens (bench/peers/exact_prompt.py, checked with
# llama-tokenize), greedy, DECODE new tokens, its own timings: prompt eval = the prefill,
# eval = the decode at depth LEN (at 32k llama-bench's two prefills take ~1.5 h). SLUICE=0 skips
# the sluice process (when its side comes from another run; the note must say so).
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
TOOL=${LLAMA_TOOL:-bench}
if [ "$TOOL" = completion ]; then
  PROMPT=$OUT/prompt-$LEN.txt
  [ -f "$PROMPT" ] || python3 "$HERE/exact_prompt.py" "$HOSTD" "$MODEL" "$LEN" "$PROMPT"
  GOT=$("$TOKENIZE" -m "$GGUF" -f "$PROMPT" --show-count --log-disable 2>/dev/null | sed -n 's/^Total number of tokens: //p' || true)
  [ "$GOT" = "$LEN" ] || { echo "llama-tokenize counts $GOT tokens in $PROMPT, not $LEN" >&2; exit 1; }
  echo "llama tool: llama-completion, one prefill of $PROMPT ($LEN tokens in both tokenizers)" >> "$OUT/meta.txt"
fi
for r in $(seq 1 "$ROUNDS"); do
  # A round's files are its own: none left from an earlier run in OUT gets paired with this one.
  rm -f "$OUT"/sluice-r$r.* "$OUT"/llama-*-r$r.*
  if [ "${SLUICE:-1}" = 0 ]; then
    echo "round $r: sluice skipped (SLUICE=0)" >> "$OUT/log.txt"
  else
    stamp "round $r sluice start"
    "$HOSTD" profile --model "$MODEL" --dense int8 --experts int8 --container "$CONTAINER" --threads "$THREADS" \
      --prompt-tokens "$LEN" --prefill-chunk 512 --decode-steps "$DECODE" --no-warmup \
      --out "$OUT/sluice-r$r.json" > "$OUT/sluice-r$r.txt" 2>&1
  fi
  if [ "$TOOL" = completion ]; then
    stamp "round $r llama-completion start"
    /usr/bin/time -v "$COMPLETION" -m "$GGUF" -t "$THREADS" -c $((LEN + DECODE + 16)) \
      -f "$PROMPT" -n "$DECODE" --ignore-eos --temp 0 -no-cnv --no-display-prompt "${EXTRA[@]}" \
      < /dev/null > "$OUT/llama-cli-r$r.out" 2> "$OUT/llama-cli-r$r.stderr"
    python3 "$HERE/completion_timings.py" "$OUT/llama-cli-r$r.stderr" "$LEN" > "$OUT/llama-cli-r$r.json"
    stamp "round $r done"
    continue
  fi
  stamp "round $r llama prefill start"
  "$BENCH" -m "$GGUF" -t "$THREADS" -r 1 -p "$LEN" -n 0 -o json "${EXTRA[@]}" > "$OUT/llama-pp-r$r.json" 2> "$OUT/llama-pp-r$r.stderr"
  stamp "round $r llama decode-at-depth start"
  "$BENCH" -m "$GGUF" -t "$THREADS" -r 1 -p 0 -n "$DECODE" -d "$LEN" -o json "${EXTRA[@]}" > "$OUT/llama-tg-r$r.json" 2> "$OUT/llama-tg-r$r.stderr"
  stamp "round $r done"
done
python3 "$HERE/longctx_round.py" "$OUT" "$ROUNDS"
