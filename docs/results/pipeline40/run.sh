#!/bin/bash
# 40-layer paired A/B of decode through expertd (issue 37, the one call pipeline): the build before
# this session's work (1b5fe7c, /tmp/oldbin) against this one (/tmp/newbin), one interleaved hostd bench run
# (ABBA order, fresh processes), every expert resident in the daemon's cache; run from the
# repo root after scripts/build. M = the realdim 40-layer checkpoint, I8 = its INT8 container.
set -euo pipefail
OUT=docs/results/pipeline40
OLD=/tmp/oldbin
NEW=/tmp/newbin
M=/tmp/rd40
I8=/tmp/rd40c
{ date -u; git rev-parse HEAD; lscpu | grep 'Model name'; nproc; sha256sum $OLD/* $NEW/*; cat /proc/loadavg; } > $OUT/meta.txt
cat $M/*.safetensors $I8/experts.sluice > /dev/null
WHOLE=$(python3 -c "import os;print(os.path.getsize('$I8/experts.sluice'))")
$NEW/hostd bench --model $M --threads 2 --runs 7 --prompt-tokens 64 --new-tokens 48 \
  --exe before=$OLD/hostd --exe after=$NEW/hostd \
  --config "before: --dense int8 --experts expertd --container $I8 --expertd-cache-bytes $WHOLE" \
  --config "after: --dense int8 --experts expertd --container $I8 --expertd-cache-bytes $WHOLE" \
  --json $OUT/ab.json > $OUT/ab.log 2>&1
echo done >> $OUT/meta.txt
