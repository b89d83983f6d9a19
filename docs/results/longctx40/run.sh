#!/usr/bin/env bash
# 40-layer 8k-token prefill + 16 decode steps at that depth, resident INT8, fresh hostd profile
# processes, before (ac335e3) / after (90aaf41) alternating ABBA.
set -euo pipefail
OUT=/work/main/docs/results/longctx40
declare -A BIN=([before]=/work/bin-fix/hostd [after]=/work/bin-attn/hostd)
i=0
for order in "before after" "after before"; do
  i=$((i+1))
  for b in $order; do
    echo "round $i $b start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    s=$(date +%s.%N)
    "${BIN[$b]}" profile --model /tmp/rd40 --dense int8 --experts int8 --container /tmp/rd40c --threads 2 \
      --prompt-tokens 8192 --prefill-chunk 512 --decode-steps 16 --no-warmup --out "$OUT/8k-r$i-$b.json" > "$OUT/8k-r$i-$b.txt" 2>&1
    echo "round $i $b done, child wall $(echo "$(date +%s.%N) - $s" | bc) s"
  done
done
