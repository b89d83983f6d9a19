#!/usr/bin/env bash
# Run llama-bench (pp512, tg128, 2 threads, 3 reps) on the Q8_0 GGUF and save
# raw JSON + metadata under docs/results/peers/. Run convert.sh first.
# PEERS_P / PEERS_N change -p / -n (default 512 / 128; the tag then says so).
# Optional bounded-memory run: PEERS_MEM_LIMIT=4G ./run.sh  (cgroup memory limit;
# systemd-run --scope if it works, else a cgroup-v1/v2 child of our own cgroup).
# Evict the GGUF from the page cache first (PEERS_EVICT=1) or the limit does nothing.
set -euo pipefail
MODEL=${MODEL:-/tmp/realdim4}
source "$(dirname "$0")/env.sh"
THREADS=${THREADS:-2}
REPS=${REPS:-3}
LIMIT=${PEERS_MEM_LIMIT:-}
# PEERS_RES: where the raw JSON and meta go (bench/headline.sh gives each run its own folder).
RES=${PEERS_RES:-$REPO/docs/results/peers}
mkdir -p "$RES"
P=${PEERS_P:-512}
N=${PEERS_N:-128}
# PEERS_ARGS: extra llama-bench knobs, e.g. the best configuration bench/peers/sweep.sh found
# ("-fa 1 -mmp 0"); recorded in the meta file with the command.
read -r -a EXTRA <<< "${PEERS_ARGS:-}"
CMD=(timeout "${BENCH_TIMEOUT:-900}" "$BENCH" -m "$GGUF" -p "$P" -n "$N" -t "$THREADS" -r "$REPS" -o json "${EXTRA[@]}")
TAG=llama-bench-$(basename "$GGUF" .gguf)-t$THREADS${LIMIT:+-mem$LIMIT}
[ "$P/$N" = 512/128 ] || TAG=$TAG-p$P-n$N
STAMP=$(date -u +%Y-%m-%dT%H:%M:%SZ)

source "$HERE/cgroup.sh"

if [ -n "${PEERS_EVICT:-}" ]; then
  # drop this file's clean pages from the page cache (posix_fadvise DONTNEED)
  python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$GGUF"
fi
if [ -n "$LIMIT" ]; then
  rm -f "$W/$TAG.cgroup.txt"
  CGROUP_REPORT="$W/$TAG.cgroup.txt" run_limited "${CMD[@]}" > "$RES/$TAG.json" 2> "$W/$TAG.stderr"
else
  "${CMD[@]}" > "$RES/$TAG.json" 2> "$W/$TAG.stderr"
fi

{
  echo "date: $STAMP"
  echo "command: ${CMD[*]}"
  [ -n "$LIMIT" ] && echo "memory limit: $LIMIT (cgroup)" && sed 's/^/cgroup after the run: /' "$W/$TAG.cgroup.txt" 2>/dev/null
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "nproc: $(nproc)"
  echo "build: see bench/peers/build-llama.sh (GGML_NATIVE=ON, AMX compiled out: tilezero faults in this VM)"
  echo "gguf: $GGUF ($(stat -c %s "$GGUF") bytes)"
  echo "model: $MODEL"
  sed 's/^/llama: /' "$W/llama-version.txt"
} > "$RES/$TAG.meta.txt"

python3 - "$RES/$TAG.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = f"pp{r['n_prompt']}" if r['n_prompt'] else f"tg{r['n_gen']}"
    print(f"{kind}: {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} tok/s  (build {r.get('build_commit')}, {r.get('n_threads')} threads, type {r.get('type_k','')})")
PY
