# Shared settings for bench/expertd/*.sh (sourced). Run from anywhere; paths are absolute.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${WORK:-/tmp/expertd-bench}"          # daemons' sockets, logs, traces, raw outputs
MODEL="${MODEL:-/tmp/realdim4}"             # hostd synth --preset realdim --layers 4
CONTAINER="${CONTAINER:-/tmp/rd4c}"         # expertd prepare /tmp/realdim4 --out /tmp/rd4c
PROMPT="${PROMPT:-Hello, who are you?}"
NEW_TOKENS="${NEW_TOKENS:-64}"
RUNS="${RUNS:-3}"
mkdir -p "$WORK/bin" "$WORK/raw"
# Snapshot the release binaries once, so a rebuild during a run cannot mix versions.
if [[ ! -x "$WORK/bin/hostd" || ! -x "$WORK/bin/expertd" ]]; then
  cp "$ROOT/target/release/hostd" "$ROOT/target/release/expertd" "$WORK/bin/"
  (cd "$ROOT" && { git rev-parse --short HEAD; git status --short; git diff | sha256sum; }) > "$WORK/bin/source-state.txt"
  sha256sum "$WORK/bin/hostd" "$WORK/bin/expertd" >> "$WORK/bin/source-state.txt"
fi
HOSTD="$WORK/bin/hostd"
EXPERTD="$WORK/bin/expertd"
RTT="${RTT:-/tmp/sluice-rtt-target/release/expertd-rtt}"
CONTAINER_BYTES=$(stat -c %s "$CONTAINER/experts.sluice")
if [[ ! -f "$CONTAINER/experts.sluice" ]]; then
  "$EXPERTD" prepare "$MODEL" --out "$CONTAINER"
fi

# start_daemon NAME ARGS... : expertd serve in the background; sets DPID; waits for the socket/port.
start_daemon() {
  local name=$1; shift
  "$EXPERTD" serve "$@" </dev/null >"$WORK/raw/$name.expertd.log" 2>&1 &
  DPID=$!
  for _ in $(seq 1 1500); do
    if grep -q "expertd serving" "$WORK/raw/$name.expertd.log" 2>/dev/null; then sleep 0.3; return 0; fi
    if ! kill -0 "$DPID" 2>/dev/null; then cat "$WORK/raw/$name.expertd.log"; return 1; fi
    sleep 0.02
  done
  echo "expertd $name not ready" >&2; return 1
}
# stop_daemon: SIGTERM (drains, finishes the route trace) and wait.
stop_daemon() { kill -TERM "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; }
read_bytes() { awk '/^read_bytes/ {print $2}' "/proc/$1/io"; }
