#!/usr/bin/env bash
# 4b. expertd RSS on realdim4 under four concurrent `hostd run` clients (unix socket + shm),
#     budget 10% of the container, default transient pool. Fresh daemon; idle VmRSS sampled
#     (max of 10 × 20 ms) before any client; then VmRSS sampled every 20 ms while the four run.
#     Cold cache at the start (fresh daemon, O_DIRECT).
source "$(dirname "$0")/common.sh"
N="${RSS_NEW_TOKENS:-32}"
B=$(( CONTAINER_BYTES / 10 ))
rm -f "$WORK/rss.sock"
start_daemon rss --container "$CONTAINER" --cache-bytes "$B" --socket "$WORK/rss.sock"
rss() { awk '/^VmRSS/ {print $2*1024}' "/proc/$1/status" 2>/dev/null || echo 0; }
idle=0; for _ in $(seq 10); do r=$(rss "$DPID"); (( r > idle )) && idle=$r; sleep 0.02; done
pids=()
for i in 1 2 3 4; do
  "$HOSTD" run --model "$MODEL" --prompt "$PROMPT (client $i)" --max-new-tokens "$N" --json --expertd "unix://$WORK/rss.sock" > "$WORK/raw/rss-client-$i.json" 2> "$WORK/raw/rss-client-$i.err" &
  pids+=($!)
done
peak=$idle; n=0; t0=$(date +%s.%N)
while :; do
  alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  (( alive )) || break
  r=$(rss "$DPID"); (( r > peak )) && peak=$r; n=$((n+1)); sleep 0.02
done
t1=$(date +%s.%N)
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
stats=$("$RTT" stats "$WORK/rss.sock")
tslots=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/raw/rss.expertd.log" | grep -o 'transient_slots=[0-9]*' | head -1 | cut -d= -f2)
stride=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/raw/rss.expertd.log" | grep -o 'blob_bytes=[0-9]*' | head -1 | cut -d= -f2)
stop_daemon
echo "{\"budget_bytes\":$B,\"transient_slots\":$tslots,\"blob_bytes\":$stride,\"idle_rss_bytes\":$idle,\"peak_rss_bytes\":$peak,\"samples\":$n,\"seconds\":$(echo "$t1 - $t0" | bc),\"clients_ok\":$([[ $rc == 0 ]] && echo true || echo false),\"stats_after\":$stats}" | tee "$WORK/raw/rss-realdim.json"
for i in 1 2 3 4; do python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], d["new_tokens"], d["decode_tokens_per_s"], d["peak_rss_bytes"])' "$WORK/raw/rss-client-$i.json" || cat "$WORK/raw/rss-client-$i.err"; done
