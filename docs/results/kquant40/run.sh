#!/bin/bash
# 40-layer A/B of INT8 vs Q4_K experts (issue 36); run from the repo root.
set -euo pipefail
OUT=docs/results/kquant40
BIN=/tmp/kqbin
M=/tmp/rd40
I8=/tmp/rd40c
Q4=/tmp/rd40q4
while [ ! -f $I8/experts.sluice ]; do sleep 5; done
{ date -u; git rev-parse HEAD; lscpu | grep 'Model name'; nproc; sha256sum $BIN/hostd $BIN/expertd; cat /proc/loadavg; } > $OUT/meta.txt
EXP_I8=$(python3 -c "import os;print(os.path.getsize('$I8/experts.sluice'))")
TENTH=$((EXP_I8 / 10))
echo "cache budget for the cold runs: $TENTH bytes (10% of the INT8 container)" >> $OUT/meta.txt
cat $M/*.safetensors $I8/experts.sluice $Q4/experts.sluice > /dev/null
$BIN/hostd bench --model $M --threads 2 --runs 3 --prompt-tokens 512 --new-tokens 64 \
  --config "int8: --dense int8 --experts int8 --container $I8" \
  --config "q4k: --dense int8 --experts int8 --container $Q4" \
  --json $OUT/resident.json > $OUT/resident.log 2>&1
$BIN/hostd bench --model $M --threads 2 --runs 3 --prompt-tokens 128 --new-tokens 32 --cold \
  --config "int8-stream: --dense int8 --experts expertd --container $I8 --expertd-cache-bytes $TENTH" \
  --config "q4k-stream: --dense int8 --experts expertd --container $Q4 --expertd-cache-bytes $TENTH" \
  --json $OUT/streaming.json > $OUT/streaming.log 2>&1
echo done >> $OUT/meta.txt
