#!/usr/bin/env bash
# Builds the helm command line from the Go module pinned in a go.mod into a versioned cache
# directory, and prints the binary's path on the last line of stdout. Skips the build when that
# binary is there. Two majors, each its own module:
#   helm v4 (default): tools/helm/go.mod, helm.sh/helm/v4, the version helm-python-sdk wraps
#     (tests/unit/docs/test_helm_pin.py keeps the two equal). `./dev helm ARGS` runs it;
#     docs/helm.md's commands use it.
#   helm v3: tools/helm/v3/go.mod, helm.sh/helm/v3, what most users still run; the chart's
#     lifecycle tests run with both (GPU_OPERATOR_HELM3, docs/helm.md "Helm 3 and Helm 4").
#
#   tools/helm/build.sh                     # helm v4: build or reuse; prints the binary
#   tools/helm/build.sh 3                   # helm v3: the same
#   GPU_OPERATOR_CP_CACHE=/path build.sh    # another cache root (default ~/.cache/gpu-operator)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

fail() { echo "helm build: $*" >&2; exit 1; }
major=${1:-4}
case "$major" in
  4) moddir=$here ;;
  3) moddir=$here/v3 ;;
  *) fail "unknown helm major '$major': give 3 or 4 (no argument: 4)" ;;
esac
module=helm.sh/helm/v$major
command -v go >/dev/null || fail "Go is not installed: install Go >= 1.26 (the helm builds need it) and retry."
version=$(awk -v m="$module" '$1 == m {print $2}' "$moddir/go.mod")
[ -n "$version" ] || fail "no $module requirement in $moddir/go.mod"
gover=$(go env GOVERSION | sed 's/^go//')
case "$gover" in 1.2[6-9]*|1.[3-9]*) ;; *) fail "Go $gover is too old: helm $version needs Go >= 1.26.";; esac

# The cache key changes whenever go.mod, go.sum, this script or the Go version changes.
key=$( (cat "$moddir/go.mod" "$moddir/go.sum" "$here/build.sh"; echo "$gover") | sha256sum | cut -c1-12)
root=${GPU_OPERATOR_CP_CACHE:-$HOME/.cache/gpu-operator}
out="$root/helm/$version-$key"
mkdir -p "$out"

# One build per cache directory at a time (two checkouts, or a test run and a setup).
exec 9>"$out/.build.lock"
if ! flock -n 9; then
  echo "helm: another build of $out is running; waiting for it" >&2
  flock 9
fi
if [ -x "$out/helm" ]; then
  echo "$out/helm"; exit 0  # quietly: `./dev helm` output is helm's own
fi

if ! timeout 60 go list -m "$module@$version" >/dev/null 2>&1; then
  fail "cannot reach the Go module proxy ($(go env GOPROXY)) to fetch $module@$version; check network/GOPROXY and retry."
fi
t0=$(date +%s)
case "$major" in
  4) cold="~2 min" ;;
  3) cold="~4 min" ;;
esac
echo "helm: [$(date +%H:%M:%S)] building helm $version from Go modules (cold: $cold on 2 cores, modules included)" >&2
# The release build's flags (helm's Makefile): the version `helm version` reports, no symbols.
ldflags="-s -w -X $module/internal/version.version=$version -X $module/internal/version.gitTreeState=clean"
if [ "$major" = 3 ]; then
  # helm v3's Makefile also stamps the Kubernetes version its client libraries speak: `helm
  # template` and `helm lint` assume it (else v1.20, below the chart's kubeVersion >=1.29).
  kv=$(cd "$moddir" && go list -m -f '{{.Version}}' k8s.io/client-go)  # v0.37.0 -> 1.37
  kmin=$(echo "$kv" | cut -d. -f2); kmaj=$(( $(echo "$kv" | cut -d. -f1 | tr -d v) + 1 ))
  for pkg in pkg/lint/rules pkg/chartutil; do
    ldflags="$ldflags -X $module/$pkg.k8sVersionMajor=$kmaj -X $module/$pkg.k8sVersionMinor=$kmin"
  done
fi
tmp=$(mktemp "$out/helm.XXXXXX")
(cd "$moddir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp" "$module/cmd/helm") && mv "$tmp" "$out/helm"
echo "helm: [$(date +%H:%M:%S)] done in $(( $(date +%s) - t0 )) s" >&2
echo "$out/helm"
