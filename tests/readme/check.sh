#!/usr/bin/env bash
# Runs the README's commands as written (CI calls it after scripts/run):
#  - the set-up commands .ci/run runs must appear verbatim in the README;
#  - the "Share one expert daemon between several programs" block is extracted from the README
#    and run as is (bash -e), then its `hostd serve` must answer /health with 200 and its
#    `hostd run` must have generated; the background daemon and server are stopped afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."

for cmd in 'scripts/run [MODEL_DIR] ["prompt"]' \
           'HOSTD_ARGS="--experts expertd --container target/synth/small.experts" scripts/run' \
           'scripts/test '; do
    grep -qF -- "$cmd" README.md || { echo "tests/readme/check.sh: README no longer says: $cmd" >&2; exit 1; }
done

block="$(awk '/^## Share one expert daemon/{s=1} s&&/^```sh$/{c=1;next} c&&/^```$/{exit} c{print}' README.md)"
[ -n "$block" ] || { echo "tests/readme/check.sh: no sh block under 'Share one expert daemon'" >&2; exit 1; }
port="$(sed -n 's/.*hostd serve .*--port \([0-9]*\).*/\1/p' <<<"${block//\\$'\n'/ }" | head -n1)"
[ -n "$port" ] || { echo "tests/readme/check.sh: the block starts no hostd serve --port N" >&2; exit 1; }

log="$(mktemp -d)"
# The block's background processes outlive its subshell: stop them by what they run.
stop_block() {
    pkill -f "expertd serve --container target/synth/small.experts --socket /tmp/sluice-$(id -u)/" 2>/dev/null || true
    pkill -f "hostd serve --model target/synth/small .*--port $port" 2>/dev/null || true
}
cleanup() { stop_block; wait 2>/dev/null || true; rm -rf "$log"; }
trap cleanup EXIT
echo "tests/readme/check.sh: running the README's shared-daemon block" >&2
set +e
( set -e; eval "$block" ) >"$log/out" 2>"$log/err" &
runner=$!
ok=0
for _ in $(seq 600); do
    if python3 -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2).status == 200 else 1)" 2>/dev/null; then
        ok=1; break
    fi
    sleep 0.2
done
set -e
wait "$runner" || { cat "$log/err" >&2; echo "tests/readme/check.sh: the README block failed" >&2; exit 1; }
[ "$ok" = 1 ] || { cat "$log/err" >&2; echo "tests/readme/check.sh: hostd serve on port $port never became ready" >&2; exit 1; }
cat "$log/out" "$log/err" | grep -q " new (" || { cat "$log/err" >&2; echo "tests/readme/check.sh: hostd run reported no generation" >&2; exit 1; }
echo "tests/readme/check.sh: README commands ran as written" >&2
