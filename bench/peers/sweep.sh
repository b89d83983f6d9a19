#!/usr/bin/env bash
# llama.cpp at its best on this machine (issue 17, item 2): sweep the CPU knobs its users tune
# with llama-bench on the Q8_0 GGUF, one knob group at a time (a full cross product would take
# hours at 40 layers), and write every raw JSON plus a summary naming the best decode and the best
# prefill configuration. Run build-llama.sh and convert.sh first.
#   decode (tg):  threads 1/2 × flash attention off/on × mmap on/off (load mode mmap/none) × --poll 0/50/100
#   prefill (pp): flash attention off/on × (batch, ubatch) in {(2048,512), (512,512), (512,256), (2048,2048)}
#   repack:       the CPU weight repack (extra buffer types) on/off, at the best decode knobs
# Env: MODEL (default /tmp/rd40), GGUF, SWEEP_N (decode tokens, default 32), SWEEP_P (prompt, 512),
#      REPS (default 2), OUT (default docs/results/peers/sweep-<model>).
set -euo pipefail
MODEL=${MODEL:-/tmp/rd40}
source "$(dirname "$0")/env.sh"
N=${SWEEP_N:-32}
P=${SWEEP_P:-512}
REPS=${REPS:-2}
OUT=${OUT:-$REPO/docs/results/peers/sweep-$(basename "$MODEL")}
mkdir -p "$OUT"
[ -x "$BENCH" ] || { echo "sweep.sh: $BENCH missing: run bench/peers/build-llama.sh" >&2; exit 2; }
[ -s "$GGUF" ] || { echo "sweep.sh: $GGUF missing: run bench/peers/convert.sh" >&2; exit 2; }
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "gguf: $GGUF ($(stat -c %s "$GGUF") bytes)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|amx|f16c|fma)' | tr '\n' ' ')"
  echo "nproc: $(nproc)"
  echo "loadavg at start: $(cat /proc/loadavg)"
  sed 's/^/llama: /' "$W/llama-version.txt"
  "$BENCH" --help 2>&1 | sed 's/^/help: /'
} > "$OUT/meta.txt"
cat "$GGUF" > /dev/null   # warm: every run below is resident

run() { # name, llama-bench args...
  local name=$1; shift
  echo "== $name: $*"
  "$BENCH" -m "$GGUF" -r "$REPS" -o json "$@" > "$OUT/$name.json" 2> "$OUT/$name.stderr" \
    || { echo "   failed (see $OUT/$name.stderr)"; rm -f "$OUT/$name.json"; }
}
# Flag spellings differ between llama-bench versions: newer ones take -fa on|off and a load
# mode (-lm mmap|none) where older ones take -fa 0|1 and -mmp 0|1, and --repack 0|1 where older
# ones had -nr (no repack).
HELP=$("$BENCH" --help 2>&1 || true)
if grep -q -- '--flash-attn <on|off' <<< "$HELP"; then FA=(-fa off,on); else FA=(-fa 0,1); fi
if grep -q -- '--load-mode' <<< "$HELP"; then MMAP=(-lm mmap,none); else MMAP=(-mmp 0,1); fi
run decode  -p 0 -n "$N" -t 1,2 "${FA[@]}" "${MMAP[@]}"
run poll    -p 0 -n "$N" -t 2 --poll 0,50,100
run prefill -p "$P" -n 0 -t 2 "${FA[@]}" -b 2048,512 -ub 512,256
run prefill-big-ubatch -p "$P" -n 0 -t 2 "${FA[@]}" -b 2048 -ub 2048
if grep -q -- '--repack <0|1>' <<< "$HELP"; then
  run repack -p "$P" -n "$N" -t 2 --repack 0,1
elif grep -q -- '--no-repack\|-nr,' <<< "$HELP"; then
  run repack -p "$P" -n "$N" -t 2 -nr 0,1
fi
echo "loadavg at end: $(cat /proc/loadavg)" >> "$OUT/meta.txt"
python3 "$HERE/sweep_summary.py" "$OUT" | tee "$OUT/summary.md"
