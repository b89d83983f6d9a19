#!/usr/bin/env bash
set -euo pipefail
while pgrep -f lc40.sh >/dev/null; do sleep 5; done
OUT=/work/main/docs/results/longctx40
echo "32k after start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
s=$(date +%s.%N)
/work/bin-attn/hostd profile --model /tmp/rd40 --dense int8 --experts int8 --container /tmp/rd40c --threads 2 \
  --prompt-tokens 32768 --prefill-chunk 512 --decode-steps 8 --no-warmup --out "$OUT/32k-after.json" > "$OUT/32k-after.txt" 2>&1
echo "32k after done, child wall $(echo "$(date +%s.%N) - $s" | bc) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
