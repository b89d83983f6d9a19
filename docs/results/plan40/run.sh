#!/bin/bash
# `hostd plan`'s predictions against `hostd bench` at 40 layers (issue 41); run from the repo
# root with nothing else running. Plans first, then the benches of the configurations the plans
# recommend (their own commands' flags), then compare.py.
set -euo pipefail
OUT=docs/results/plan40
BIN=${BIN:-/tmp/planbin}
M=${MODEL:-/tmp/rd40}        # hostd synth --preset realdim --layers 40 --experts 32 --seed 1
I8=${INT8:-/tmp/rd40c}       # expertd prepare $M --out $I8
Q4=${Q4K:-/tmp/rd40q4}       # expertd prepare $M --out $Q4 --format q4k
MEM=${MEM:-6.2GiB}           # a smaller machine: no format fits resident
mkdir -p "$BIN"; cp target/release/hostd target/release/expertd "$BIN"/
{ date -u; git rev-parse HEAD; git status --short | head; lscpu | grep 'Model name'; nproc; free -b | head -2;
  sha256sum $BIN/hostd $BIN/expertd; cat /proc/loadavg; } > $OUT/meta.txt
# 1. This machine as it is (every format fits resident), and a --memory machine (streaming).
$BIN/hostd plan $M --container $I8 --json > $OUT/plan-resident.json
$BIN/hostd plan $M --container $Q4 --memory $MEM --json > $OUT/plan-streaming.json
CACHE=$(python3 -c "import json;d=json.load(open('$OUT/plan-streaming.json'));print({f['format']:f['cache_bytes'] for f in d['formats']}['q4k'])")
CACHE_I8=$(python3 -c "import json;d=json.load(open('$OUT/plan-streaming.json'));print({f['format']:f['cache_bytes'] for f in d['formats']}['int8'])")
echo "streaming cache budgets from the plan: q4k $CACHE, int8 $CACHE_I8" >> $OUT/meta.txt
# 2. Resident, in process (the plan's recommended command and the q4k row): warm, 512-token prompt.
cat $M/*.safetensors $I8/experts.sluice $Q4/experts.sluice > /dev/null
$BIN/hostd bench --model $M --threads 2 --runs 3 --prompt-tokens 512 --new-tokens 64 \
  --config "int8: --dense int8 --experts int8 --container $I8" \
  --config "q4k: --dense int8 --experts int8 --container $Q4" \
  --json $OUT/resident.json > $OUT/resident.log 2>&1
# 3. Streaming through a private expertd with the plan's cache budget, cold (page cache dropped).
$BIN/hostd bench --model $M --threads 2 --runs 3 --prompt-tokens 128 --new-tokens 32 --cold \
  --config "q4k-stream: --dense int8 --experts expertd --container $Q4 --expertd-cache-bytes $CACHE" \
  --config "int8-stream: --dense int8 --experts expertd --container $I8 --expertd-cache-bytes $CACHE_I8" \
  --json $OUT/streaming.json > $OUT/streaming.log 2>&1
python3 $OUT/compare.py $OUT > $OUT/comparison.md
echo done >> $OUT/meta.txt
