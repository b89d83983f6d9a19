#!/usr/bin/env bash
# 32k prompt with the experts in a private expertd (full cache): hostd's own peak RSS against the issue's bound.
set -euo pipefail
# (it waited for a CI run to finish first)
OUT=/work/main/docs/results/longctx40
echo "32k expertd start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
s=$(date +%s.%N)
/work/main/target/release/hostd profile --model /tmp/rd40 --dense int8 --experts expertd --container /tmp/rd40c --threads 2 \
  --prompt-tokens 32768 --prefill-chunk 512 --decode-steps 8 --no-warmup --out "$OUT/32k-expertd.json" > "$OUT/32k-expertd.txt" 2>&1
echo "32k expertd done, child wall $(echo "$(date +%s.%N) - $s" | bc) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
