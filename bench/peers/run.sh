#!/usr/bin/env bash
# Run llama-bench (pp512, tg128, 2 threads, 3 reps) on the Q8_0 GGUF and save
# raw JSON + metadata under docs/results/peers/. Run convert.sh first.
# PEERS_P / PEERS_N change -p / -n (default 512 / 128; the tag then says so).
# Optional bounded-memory run: PEERS_MEM_LIMIT=4G ./run.sh  (cgroup memory limit;
# systemd-run --scope if it works, else a cgroup-v1/v2 child of our own cgroup).
# Evict the GGUF from the page cache first (PEERS_EVICT=1) or the limit does nothing.
set -euo pipefail
W=${PEERS_WORK:-/tmp/peers}
MODEL=${MODEL:-/tmp/realdim4}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
GGUF=${GGUF:-$W/$(basename "$MODEL")-q8_0.gguf}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
LIMIT=${PEERS_MEM_LIMIT:-}
RES=$REPO/docs/results/peers
mkdir -p "$RES"
BENCH=$W/llama.cpp/build/bin/llama-bench
P=${PEERS_P:-512}
N=${PEERS_N:-128}
CMD=(timeout "${BENCH_TIMEOUT:-900}" "$BENCH" -m "$GGUF" -p "$P" -n "$N" -t "$THREADS" -r "$REPS" -o json)
TAG=llama-bench-$(basename "$GGUF" .gguf)-t$THREADS${LIMIT:+-mem$LIMIT}
[ "$P/$N" = 512/128 ] || TAG=$TAG-p$P-n$N
STAMP=$(date -u +%Y-%m-%dT%H:%M:%SZ)

run_limited() {
  if systemd-run --scope -q -p MemoryMax="$LIMIT" true 2>/dev/null; then
    systemd-run --scope -q -p MemoryMax="$LIMIT" "$@"; return
  fi
  local bytes; bytes=$(numfmt --from=iec "$LIMIT")
  local cg
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then          # v2
    cg=/sys/fs/cgroup$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup)/peers-$$
    mkdir "$cg"; echo "$bytes" > "$cg/memory.max"
  else                                                        # v1
    cg=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/peers-$$
    mkdir "$cg"; echo "$bytes" > "$cg/memory.limit_in_bytes"
  fi
  # the page cache of the mmapped GGUF is charged to this cgroup too
  local rc=0
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$@" || rc=$?
  rmdir "$cg" 2>/dev/null || true
  return $rc
}

if [ -n "${PEERS_EVICT:-}" ]; then
  # drop this file's clean pages from the page cache (posix_fadvise DONTNEED)
  python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$GGUF"
fi
if [ -n "$LIMIT" ]; then
  run_limited "${CMD[@]}" > "$RES/$TAG.json" 2> "$W/$TAG.stderr"
else
  "${CMD[@]}" > "$RES/$TAG.json" 2> "$W/$TAG.stderr"
fi

{
  echo "date: $STAMP"
  echo "command: ${CMD[*]}"
  [ -n "$LIMIT" ] && echo "memory limit: $LIMIT (cgroup)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "nproc: $(nproc)"
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
