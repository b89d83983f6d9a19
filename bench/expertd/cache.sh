#!/usr/bin/env bash
# 3. Hits, misses and bytes read per token at three cache budgets (10%, 30%, 100% of the
#    container), cold then warm. Per budget: a FRESH daemon (io_uring, O_DIRECT when the log's
#    `io=` says so, so the page cache is bypassed and every miss is a physical read), LRU,
#    --route-trace; run 1 (cold: empty cache) and run 2 (warm: same daemon, second run of the
#    same prompt). Around each run: the Stats RPC and /proc/<expertd>/io read_bytes (physical
#    reads of the daemon process). After SIGTERM: `expertd replay` of the trace (must be exact)
#    and trace_summary.py (prefill step vs decode steps per session).
source "$(dirname "$0")/common.sh"
OUT="$WORK/raw/cache.jsonl"; : > "$OUT"
HERE="$(cd "$(dirname "$0")" && pwd)"
for pct in ${PCTS:-10 30 100}; do
  B=$(( CONTAINER_BYTES * pct / 100 ))
  T="$WORK/raw/trace-$pct.jsonl"; rm -f "$T" "$WORK/cache.sock"
  start_daemon "cache-$pct" --container "$CONTAINER" --cache-bytes "$B" --socket "$WORK/cache.sock" --io uring --policy lru --route-trace "$T"
  iol=$(sed "s/\x1b\[[0-9;]*m//g" "$WORK/raw/cache-$pct.expertd.log" | grep -o "io=io=[^ ]* o_direct=[a-z]*" | head -1)
  for phase in cold warm; do
    rb0=$(read_bytes "$DPID"); s0=$("$RTT" stats "$WORK/cache.sock")
    j=$("$HOSTD" run --model "$MODEL" --prompt "$PROMPT" --max-new-tokens "$NEW_TOKENS" --json --expertd "unix://$WORK/cache.sock" | python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("text"); d.pop("generated_ids"); print(json.dumps(d))')
    rb1=$(read_bytes "$DPID"); s1=$("$RTT" stats "$WORK/cache.sock")
    echo "{\"pct\":$pct,\"budget_bytes\":$B,\"phase\":\"$phase\",\"io\":$(printf '%s' "$iol" | python3 -c 'import json,sys;print(json.dumps(sys.stdin.read()))'),\"read_bytes_before\":$rb0,\"read_bytes_after\":$rb1,\"stats_before\":$s0,\"stats_after\":$s1,\"run\":$j}" | tee -a "$OUT"
  done
  stop_daemon
  "$EXPERTD" replay "$T" --json > "$WORK/raw/replay-$pct.json" || echo "REPLAY MISMATCH at $pct%" | tee -a "$OUT"
  "$EXPERTD" replay "$T" > "$WORK/raw/replay-$pct.txt" || true
  python3 "$HERE/trace_summary.py" "$T" > "$WORK/raw/trace-summary-$pct.json"
done
