#!/usr/bin/env bash
# The live feed's cost at 40 layers (issue 41): decode tok/s of hostd serve with and without a
# /v1/live reader, interleaved (measure.py), for in-process INT8 experts and for a private
# expertd (whose Stats call each frame makes). Realdim 40-layer synthetic checkpoint at $M, its
# INT8 container at $I8 (hostd synth --preset realdim; expertd prepare).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/results/web-live
M=${M:-/tmp/rd40}
I8=${I8:-/tmp/rd40c}
ROUNDS=${ROUNDS:-8}
N=${N:-64}
{ date -u; git rev-parse HEAD; lscpu | grep 'Model name'; nproc; cat /proc/loadavg; } > $OUT/meta.txt
cat $M/*.safetensors $I8/experts.sluice > /dev/null
for experts in int8 expertd; do
    log=$(mktemp)
    target/release/hostd serve --model $M --threads 2 --dense int8 --experts $experts \
        --container $I8 --port 8093 > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 1200); do grep -q '^hostd serve: ready' "$log" && break; sleep 0.5; done
    eos=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["eos_token_id"]))' $M/generation_config.json)
    python3 $OUT/measure.py http://127.0.0.1:8093 "$ROUNDS" "$N" "$eos" > $OUT/$experts.json
    kill $pid; wait $pid 2>/dev/null || true
    rm -f "$log"
done
cat /proc/loadavg >> $OUT/meta.txt
