#!/bin/bash
# 40-layer paired A/B of decode through expertd (issue 37): the build before the hostile-client
# work (bfa0c9c, /tmp/kqbin) against this one (/tmp/newbin), 5 interleaved runs; run from the
# repo root after scripts/build (the harness: scripts/bench-expertd-ab).
set -euo pipefail
scripts/bench-expertd-ab /tmp/kqbin /tmp/newbin docs/results/hostile40 5
