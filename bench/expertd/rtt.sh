#!/usr/bin/env bash
# 1. Per-call round trip of hostd's expertd client, per transport (see rtt/src/main.rs for
#    exactly what one timed call covers). Two payloads:
#      tiny : tests/fixtures/models/tiny container (hidden 64, 1 row, top-1) — the empty-ish call
#      rd4  : /tmp/rd4c (hidden 2048, 1 row, top-8) — one real decode-step MoE call, all cached
#    Transports: shm over the unix socket, inline over the unix socket, inline over TCP + token.
#    Each configuration: a fresh daemon (budget = whole container, warm after the client's 200
#    warm-up calls), then RUNS fresh client processes of CALLS timed calls each.
source "$(dirname "$0")/common.sh"
CALLS="${CALLS:-2000}"
TINYC="$WORK/tinyc"
[[ -f "$TINYC/experts.sluice" ]] || "$EXPERTD" prepare "$ROOT/tests/fixtures/models/tiny" --out "$TINYC" >/dev/null
echo "s3cret-bench-token" > "$WORK/token"
OUT="$WORK/raw/rtt.jsonl"; : > "$OUT"
for payload in tiny rd4; do
  if [[ $payload == tiny ]]; then C=$TINYC; DIMS="4 8 64 1"; else C=$CONTAINER; DIMS="4 256 2048 8"; fi
  CB=$(stat -c %s "$C/experts.sluice")
  for transport in shm uds-inline tcp; do
    if [[ $transport == tcp ]]; then
      start_daemon "rtt-$payload-$transport" --container "$C" --cache-bytes "$CB" --listen 127.0.0.1:47071 --auth-token-file "$WORK/token" --insecure
      URI=http://127.0.0.1:47071; EXTRA=(--token-file "$WORK/token")
    else
      rm -f "$WORK/rtt.sock"
      start_daemon "rtt-$payload-$transport" --container "$C" --cache-bytes "$CB" --socket "$WORK/rtt.sock"
      URI="unix://$WORK/rtt.sock"; EXTRA=(); [[ $transport == uds-inline ]] && EXTRA=(--no-shm)
    fi
    for r in $(seq 1 "$RUNS"); do
      line=$("$RTT" "$URI" $DIMS "$CALLS" "${EXTRA[@]}")
      echo "{\"payload\":\"$payload\",\"transport\":\"$transport\",\"run\":$r,\"result\":$line}" | tee -a "$OUT"
    done
    stop_daemon
  done
done
