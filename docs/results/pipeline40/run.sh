#!/bin/bash
# 40-layer paired A/B of decode through expertd (issue 37, the one call pipeline): the build before
# this session's work (1b5fe7c, /tmp/oldbin) against this one (/tmp/newbin), 7 interleaved runs;
# run from the repo root after scripts/build (the harness: scripts/bench-expertd-ab).
set -euo pipefail
scripts/bench-expertd-ab /tmp/oldbin /tmp/newbin docs/results/pipeline40 7
