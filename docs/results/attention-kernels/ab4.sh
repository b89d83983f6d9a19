#!/usr/bin/env bash
# Interleaved A/B of attention_core binaries (fresh process each), load recorded around each run.
# Usage: [AB_DIR=dir] ab4.sh ROUNDS MODE LEN BUILD...
set -u
rounds=$1; mode=$2; len=$3; shift 3
dir=${AB_DIR:-$(dirname "$0")}
for r in $(seq 1 "$rounds"); do
  for which in "$@"; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    out=$("$dir/attention_core-$which" tiled "$mode" "$len" --bench 2>/dev/null | tail -1)
    load2=$(cut -d' ' -f1 /proc/loadavg)
    echo "{\"round\":$r,\"build\":\"$which\",\"load1_before\":$load,\"load1_after\":$load2,\"at\":\"$(date -u +%H:%M:%S)\",\"result\":$out}"
  done
done
