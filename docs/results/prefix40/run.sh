#!/bin/bash
# Issue 39's agent loop at the real depth: scripts/bench-agent against hostd serve on the
# 40-layer realdim checkpoint (M) with INT8 dense weights and its INT8 container (I8) read in
# process, every expert resident (page cache warm), 2 threads. Run from the repo root after
# scripts/build.
set -euo pipefail
OUT=docs/results/prefix40
M=/tmp/rd40
I8=/tmp/rd40c
{ date -u; git rev-parse HEAD; lscpu | grep 'Model name'; nproc; cat /proc/loadavg; } > $OUT/meta.txt
cat $M/*.safetensors $I8/experts.sluice > /dev/null
scripts/bench-agent --hostd target/release/hostd --json $OUT/agent.json \
  --prefix-tokens 16000 --turn-tokens 200 --concurrent-prompt-tokens 4000 -- \
  --model $M --threads 2 --dense int8 --experts int8 --container $I8 \
  --state-cache-bytes $((4 << 30)) > $OUT/agent.log 2>&1
echo done >> $OUT/meta.txt
