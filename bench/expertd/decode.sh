#!/usr/bin/env bash
# 2. Decode tokens/s on realdim4: in-process INT8 vs expertd (unix socket + shm, budget = the
#    whole container, warm). Each number is one fresh `hostd run` process; decode_tokens_per_s
#    is hostd's own figure (decode steps after the first token / decode wall time).
#    expertd: one daemon for all runs; one discarded warm-up run fills the cache first, so every
#    measured run is 100% hits (checked with the Stats RPC before/after each run).
#    Order is interleaved (int8, expertd, int8, ...) so drift hits both equally.
source "$(dirname "$0")/common.sh"
OUT="$WORK/raw/decode.jsonl"; : > "$OUT"
rm -f "$WORK/dec.sock"
start_daemon decode --container "$CONTAINER" --cache-bytes "$CONTAINER_BYTES" --socket "$WORK/dec.sock"
# Warm-up: page cache for the checkpoint (both backends), the container (int8), the daemon's cache.
"$HOSTD" run --model "$MODEL" --prompt "$PROMPT" --max-new-tokens "$NEW_TOKENS" --json --experts int8 --container "$CONTAINER" > "$WORK/raw/decode-warmup-int8.json"
"$HOSTD" run --model "$MODEL" --prompt "$PROMPT" --max-new-tokens "$NEW_TOKENS" --json --expertd "unix://$WORK/dec.sock" > "$WORK/raw/decode-warmup-expertd.json"
for r in $(seq 1 "$RUNS"); do
  j=$("$HOSTD" run --model "$MODEL" --prompt "$PROMPT" --max-new-tokens "$NEW_TOKENS" --json --experts int8 --container "$CONTAINER" | python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("text"); d.pop("generated_ids"); print(json.dumps(d))')
  echo "{\"backend\":\"int8\",\"run\":$r,\"result\":$j}" | tee -a "$OUT"
  s0=$("$RTT" stats "$WORK/dec.sock")
  j=$("$HOSTD" run --model "$MODEL" --prompt "$PROMPT" --max-new-tokens "$NEW_TOKENS" --json --expertd "unix://$WORK/dec.sock" | python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("text"); d.pop("generated_ids"); print(json.dumps(d))')
  s1=$("$RTT" stats "$WORK/dec.sock")
  echo "{\"backend\":\"expertd-shm\",\"run\":$r,\"result\":$j,\"stats_before\":$s0,\"stats_after\":$s1}" | tee -a "$OUT"
done
stop_daemon
