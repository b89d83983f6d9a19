#!/usr/bin/env bash
# Checks deploy/ offline (run by scripts/test; needs the release binaries and target/venv):
#  1. every systemd unit passes `systemd-analyze verify` with no warning (ExecStart pointed at
#     the built binaries), and the daemon's syscall filter adds the io_uring calls that no
#     @group holds;
#  2. the Kubernetes base renders (`kubectl kustomize` or `kustomize build`; without either, the
#     resources listed in kustomization.yaml are concatenated by hand, said loudly) and every
#     resource validates strictly against the schemas of Kubernetes 1.37 (kubernetes-validate);
#     a manifest with a misspelt field is refused, so the validator is really checking.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin="${CARGO_TARGET_DIR:-target}/release"
python="${SLUICE_VENV:-target/venv}/bin/python3"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "tests/deploy: FAIL: $*" >&2; exit 1; }

# 1. systemd units.
command -v systemd-analyze >/dev/null || fail "systemd-analyze not found (apt-get install systemd; .ci/run does)"
cp deploy/systemd/*.service deploy/systemd/*.socket "$work/"
# The units name the binaries by absolute path ($CARGO_TARGET_DIR may be absolute already).
case $bin in /*) bin_path=$bin ;; *) bin_path=$root/$bin ;; esac
sed -i "s|/usr/local/bin/|$bin_path/|" "$work"/*.service
for f in expertd hostd; do [[ -x $bin/$f ]] || fail "$bin/$f not built (scripts/build)"; done
(cd "$work" && systemd-analyze verify sluice-expertd.socket sluice-expertd.service sluice-hostd@main.service) >"$work/verify.log" 2>&1 ||
    { cat "$work/verify.log" >&2; fail "systemd-analyze verify"; }
[[ ! -s $work/verify.log ]] || { cat "$work/verify.log" >&2; fail "systemd-analyze verify printed warnings"; }
echo "tests/deploy: systemd-analyze verify: sluice-expertd.socket, sluice-expertd.service, sluice-hostd@.service pass"
if systemd-analyze syscall-filter @system-service | grep -q io_uring; then
    echo "tests/deploy: note: this systemd's @system-service already holds io_uring"
fi
for call in io_uring_setup io_uring_enter io_uring_register; do
    grep -Eq "^SystemCallFilter=([^~].*)?\b$call\b" deploy/systemd/sluice-expertd.service || fail "sluice-expertd.service's SystemCallFilter does not allow $call"
    ! grep -Eq "^SystemCallFilter=~.*\b$call\b" deploy/systemd/sluice-expertd.service || fail "sluice-expertd.service denies $call"
done
echo "tests/deploy: sluice-expertd.service allows io_uring_setup/enter/register beside @system-service"

# 2. Kubernetes.
rendered=$work/k8s.yaml
if command -v kubectl >/dev/null && kubectl kustomize deploy/k8s >"$rendered" 2>"$work/kustomize.log"; then
    echo "tests/deploy: rendered deploy/k8s with kubectl kustomize"
elif command -v kustomize >/dev/null && kustomize build deploy/k8s >"$rendered" 2>"$work/kustomize.log"; then
    echo "tests/deploy: rendered deploy/k8s with kustomize build"
else
    [[ -s $work/kustomize.log ]] && { cat "$work/kustomize.log" >&2; fail "kustomize could not render deploy/k8s"; }
    echo "tests/deploy: WARNING: no kubectl or kustomize here: validating the resources kustomization.yaml lists, concatenated by hand (not a kustomize render)" >&2
    "$python" - deploy/k8s >"$rendered" <<'PY'
import pathlib, sys
base = pathlib.Path(sys.argv[1])
lines = (base / "kustomization.yaml").read_text().splitlines()
start = lines.index("resources:") + 1
for line in lines[start:]:
    if not line.startswith("  - "):
        break
    print("---")
    print((base / line[4:].strip()).read_text())
PY
fi
grep -q "^kind: DaemonSet" "$rendered" || fail "the render has no DaemonSet"
"$python" -m kubernetes_validate --strict --quiet -k 1.37.0 "$rendered" || fail "deploy/k8s does not validate against Kubernetes 1.37"
echo "tests/deploy: deploy/k8s validates against the Kubernetes 1.37 schemas ($(grep -c '^kind:' "$rendered") resources)"
sed 's/^\(\s*\)containerPort:/\1containerPrt:/' deploy/k8s/hostd-deployment.yaml >"$work/broken.yaml"
if "$python" -m kubernetes_validate --strict --quiet -k 1.37.0 "$work/broken.yaml" >/dev/null 2>&1; then
    fail "kubernetes-validate accepted a misspelt field: it is not checking"
fi
echo "tests/deploy: OK"
