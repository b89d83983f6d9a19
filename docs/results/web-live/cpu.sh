#!/usr/bin/env bash
# The live feed's own CPU cost at 40 layers (issue 41): CPU seconds that hostd serve and its
# private expertd use per wall second while idle, without and then with a /v1/live reader
# (1 s frames, what the page opens), from /proc/<pid>/stat utime+stime (both processes). Idle,
# so nothing else runs: the difference is the feed's sampling (metrics, routing counts, the
# daemon's Stats call, JSON) and its delivery.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=docs/results/web-live
M=${M:-/tmp/rd40}
I8=${I8:-/tmp/rd40c}
SECS=${SECS:-60}
log=$(mktemp)
target/release/hostd serve --model $M --threads 2 --dense int8 --experts expertd \
    --container $I8 --port 8094 > "$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1200); do grep -q '^hostd serve: ready' "$log" && break; sleep 0.5; done
daemon=$(pgrep -P $pid -x expertd | head -n1)
ticks() { awk '{s += $14 + $15} END {print s}' /proc/$pid/stat /proc/$daemon/stat; }
hz=$(getconf CLK_TCK)
measure() {
    local a b
    a=$(ticks); sleep "$SECS"; b=$(ticks)
    python3 -c "print(($b - $a) / $hz / $SECS)"
}
sleep 5
off=$(measure)
curl -sN http://127.0.0.1:8094/v1/live?interval_ms=1000 > "$log.frames" &
reader=$!
sleep 2
on=$(measure)
kill $reader
frames=$(grep -c '^data:' "$log.frames")
bytes=$(wc -c < "$log.frames")
python3 - "$off" "$on" "$frames" "$bytes" "$SECS" > $OUT/cpu.json <<'PY'
import json, sys
off, on, frames, nbytes, secs = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print(json.dumps({
    "what": "CPU seconds per wall second of hostd serve + its private expertd, idle, 40 layers x 32 experts, INT8",
    "window_s": secs,
    "idle_cpu_s_per_s_without_reader": off,
    "idle_cpu_s_per_s_with_reader": on,
    "feed_cpu_s_per_s": on - off,
    "feed_share_of_two_cores": (on - off) / 2,
    "frames_read": frames,
    "bytes_per_frame": nbytes / max(frames, 1),
}, indent=1))
PY
cat $OUT/cpu.json
rm -f "$log" "$log.frames"
