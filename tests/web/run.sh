#!/usr/bin/env bash
# Runs the web page's browser test (tests/web/test_page.py) in headless Chromium against a real
# `hostd serve` with an API key, a synthetic model (hostd synth --preset small) and a private
# expertd, so the live panel has a cache, sessions and per-layer misses to show. Screenshots of
# each state go to ${CARGO_TARGET_DIR:-target}/web-shots/. Needs Debian's chromium and
# chromium-driver (scripts/prereqs names them); builds the release binaries unless HOSTD_BIN
# names a hostd. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in chromium chromedriver; do
    command -v "$tool" >/dev/null || { echo "tests/web/run.sh: $tool not found (apt-get install -y chromium chromium-driver)" >&2; exit 1; }
done
if [ -z "${HOSTD_BIN:-}" ]; then
    scripts/build --quiet
    HOSTD_BIN="${CARGO_TARGET_DIR:-target}/release/hostd"
fi
PATH="$(scripts/pyenv):$PATH"
shots="${CARGO_TARGET_DIR:-target}/web-shots"
mkdir -p "$shots"

work="$(mktemp -d)"
server=""
cleanup() {
    [ -z "$server" ] || { kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT
"$HOSTD_BIN" synth --preset small --out "$work/small" 2>"$work/synth.log" ||
    { cat "$work/synth.log" >&2; exit 1; }
head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$work/key"
"$HOSTD_BIN" serve --model "$work/small" --experts expertd --container "$work/small.experts" \
    --api-key-file "$work/key" --host 127.0.0.1 --port 0 --threads 2 \
    >"$work/stdout" 2>"$work/stderr" &
server=$!
addr=""
for _ in $(seq 1200); do
    addr="$(sed -n 's#^hostd serve: listening on \(http://.*\)$#\1#p' "$work/stdout" | head -n1)"
    grep -q '^hostd serve: ready' "$work/stdout" && break
    kill -0 "$server" 2>/dev/null || { cat "$work/stderr" >&2; echo "tests/web/run.sh: hostd serve exited" >&2; exit 1; }
    sleep 0.1
done
grep -q '^hostd serve: ready' "$work/stdout" || { cat "$work/stderr" >&2; echo "tests/web/run.sh: hostd serve never became ready" >&2; exit 1; }

export SLUICE_WEB_URL="$addr" SLUICE_API_KEY="$(cat "$work/key")" SLUICE_WEB_SHOTS="$shots"
python3 -m pytest -q -rs tests/web "$@"
