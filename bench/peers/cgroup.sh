# Sourced by bench/peers/run.sh and bench/headline.sh: `run_limited CMD...` runs CMD in a
# memory cgroup limited to $LIMIT (bytes or IEC, e.g. 4G): `systemd-run --scope` when it
# works, else a fresh child of our own cgroup (v2 memory.max or v1 memory.limit_in_bytes; v1
# and v2 both charge the page cache a process faults in to its cgroup, and there is no swap
# here, so the limit bounds RSS plus page cache). Prints where the limit was set and, on v1,
# the peak usage and how often the limit was hit (to $CGROUP_REPORT if set, else stderr).
run_limited() {
  if systemd-run --scope -q -p MemoryMax="$LIMIT" true 2>/dev/null; then
    systemd-run --scope -q -p MemoryMax="$LIMIT" "$@"; return
  fi
  local bytes; bytes=$(numfmt --from=iec "$LIMIT")
  local cg
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then          # v2
    cg=/sys/fs/cgroup$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup)/peers-$$
    mkdir "$cg"; echo "$bytes" > "$cg/memory.max"
  else                                                        # v1
    cg=/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/peers-$$
    mkdir "$cg"; echo "$bytes" > "$cg/memory.limit_in_bytes"
  fi
  # the page cache of the mmapped GGUF is charged to this cgroup too
  local rc=0
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cg" "$@" || rc=$?
  {
    echo "cgroup: $cg"
    for f in memory.limit_in_bytes memory.max_usage_in_bytes memory.failcnt memory.max memory.peak; do
      if [ -f "$cg/$f" ]; then echo "$f: $(cat "$cg/$f")"; fi
    done
  } >> "${CGROUP_REPORT:-/dev/stderr}"
  rmdir "$cg" 2>/dev/null || true
  return $rc
}

