#!/bin/bash
# Issue 39's decode-beside-prefill figure at the real depth: scripts/bench-agent's first phase
# only (a short stream's decode speed alone, then while a ~4000-token prompt is prefilled), on
# the 40-layer realdim checkpoint (M) with INT8 dense weights and its INT8 container (I8) in
# process, page cache warm, 2 threads. Run from the repo root after scripts/build.
set -euo pipefail
OUT=docs/results/prefix40
M=/tmp/rd40
I8=/tmp/rd40c
{ date -u; git rev-parse HEAD; lscpu | grep 'Model name'; nproc; cat /proc/loadavg; } > $OUT/meta-concurrent.txt
cat $M/*.safetensors $I8/experts.sluice > /dev/null
scripts/bench-agent --hostd target/release/hostd --json $OUT/concurrent.json \
  --concurrent-prompt-tokens 4000 --only-concurrent -- \
  --model $M --threads 2 --dense int8 --experts int8 --container $I8 \
  --state-cache-bytes $((4 << 30)) > $OUT/concurrent.log 2>&1
echo done >> $OUT/meta-concurrent.txt
