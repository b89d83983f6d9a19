#!/usr/bin/env bash
# Builds the per-call round-trip client (bench/expertd/rtt) into its own target dir.
set -euo pipefail
cd "$(dirname "$0")/rtt"
CARGO_TARGET_DIR="${RTT_TARGET_DIR:-/tmp/sluice-rtt-target}" cargo build --release --offline
