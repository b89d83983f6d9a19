#!/usr/bin/env bash
# Runs the client suite (tests/openai/test_*.py: the official OpenAI and Anthropic clients) against a real `hostd serve` on a
# free loopback port with the tiny fixture model: starts the server, waits for /health, runs
# pytest, stops the server. Builds the release binaries (scripts/build) unless HOSTD_BIN names a
# hostd, and runs Python from the project-local environment (scripts/pyenv, target/venv) with
# tests/openai/requirements.txt installed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."

MODEL_DIR="${SLUICE_TEST_MODEL:-tests/fixtures/models/tiny}"
if [ -z "${HOSTD_BIN:-}" ]; then
    scripts/build --quiet
    HOSTD_BIN="${CARGO_TARGET_DIR:-target}/release/hostd"
fi
PATH="$(scripts/pyenv):$PATH"

log="$(mktemp -d)"
"$HOSTD_BIN" serve --model "$MODEL_DIR" --host 127.0.0.1 --port 0 --served-model-name sluice-test \
    --threads 2 >"$log/stdout" 2>"$log/stderr" &
server=$!
cleanup() {
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$log"
}
trap cleanup EXIT

# The first stdout line names the bound address; wait for it and for /health (≤ 60 s each).
addr=""
for _ in $(seq 600); do
    addr="$(sed -n 's#^hostd serve: listening on \(http://.*\)$#\1#p' "$log/stdout" | head -n1)"
    [ -n "$addr" ] && break
    kill -0 "$server" 2>/dev/null || { cat "$log/stderr" >&2; echo "tests/openai/run.sh: hostd serve exited" >&2; exit 1; }
    sleep 0.1
done
[ -n "$addr" ] || { cat "$log/stderr" >&2; echo "tests/openai/run.sh: no address from hostd serve" >&2; exit 1; }
ready=0
for _ in $(seq 600); do
    if python3 - "$addr" <<'PY'
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).status == 200 else 1)
except Exception:
    sys.exit(1)
PY
    then ready=1; break; fi
    sleep 0.1
done
[ "$ready" = 1 ] || { cat "$log/stderr" >&2; echo "tests/openai/run.sh: $addr/health never became ready" >&2; exit 1; }

export SLUICE_BASE_URL="$addr/v1" SLUICE_MODEL_NAME=sluice-test
python3 -m pytest -q -rs tests/openai "$@"
