# Shared setup of the bench harnesses (sourced by bench/{headline,longctx,boundary40}.sh and
# bench/peers/paired.sh): the repository root, the common defaults, and the steps every run
# repeats: copy the release binaries aside, make the synthetic checkpoint and its container on
# first use, say when and which commit ran, pick llama.cpp's best knobs. Run from anywhere.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The build to measure.
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
THREADS=${THREADS:-2}
SEED=${SEED:-1}

# snapshot_bins DIR [FILE…]: copies the release hostd and expertd (and any FILEs) into DIR, so
# that a rebuild during the bench cannot swap the binaries under it.
snapshot_bins() {
  local dir=$1; shift
  mkdir -p "$dir"
  cp "$TARGET/release/hostd" "$TARGET/release/expertd" "$@" "$dir/"
}

# ensure_fixture BIN: the realdim checkpoint MODEL (LAYERS layers, EXPERTS experts per layer,
# empty: the preset's 256; SEED) and its container CONTAINER, each made with BIN's binaries
# unless it exists. A MODEL that is a file (a GGUF) is never made here.
ensure_fixture() {
  local bin=$1
  [ -e "$MODEL" ] || "$bin/hostd" synth --preset realdim --layers "$LAYERS" ${EXPERTS:+--experts "$EXPERTS"} --seed "$SEED" --out "$MODEL"
  [ -f "$CONTAINER/experts.sluice" ] || "$bin/expertd" prepare "$MODEL" --out "$CONTAINER"
}

# start_run: the start of a headline-style run: OUT made, the binaries copied into BIN, the
# fixture made, CBYTES set to the container's size and TENTH to a tenth of it (the streaming
# runs' cache budget); the working directory is then REPO.
start_run() {
  mkdir -p "$OUT"
  snapshot_bins "$BIN"
  ensure_fixture "$BIN"
  CBYTES=$(stat -c %s "$CONTAINER/experts.sluice")
  TENTH=$((CBYTES / 10))
  cd "$REPO"
}

# start_meta: the first lines of a run's meta.txt: the time, and the commit measured (`clean`,
# or `DIRTY` when tracked files differ from it).
start_meta() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$REPO" rev-parse HEAD) $([ -z "$(git -C "$REPO" status --porcelain --untracked-files=no)" ] && echo clean || echo DIRTY)"
}

# best_peers_args: the llama-bench knobs of the fastest decode configuration that
# bench/peers/sweep.sh found for MODEL on this machine; PEERS_ARGS when it is set (empty means
# llama-bench's defaults), nothing when there is no sweep.
best_peers_args() {
  local sweep=$REPO/docs/results/peers/sweep-$(basename "$MODEL")
  if [ -n "${PEERS_ARGS+x}" ]; then
    echo "$PEERS_ARGS"
  elif [ -f "$sweep/summary.json" ]; then
    python3 "$REPO/bench/peers/sweep_summary.py" "$sweep" --flags decode
  fi
}
