#!/usr/bin/env bash
# Builds the helm command line from the Go module pinned in go.mod (helm.sh/helm/v4, the version
# helm-python-sdk wraps; tests/unit/docs/test_helm_pin.py keeps the two equal) into a versioned
# cache directory, and prints the binary's path on the last line of stdout. Skips the build when
# that binary is there. `./dev helm ARGS` runs it; docs/helm.md's commands use it.
#
#   tools/helm/build.sh                     # build or reuse; prints the binary
#   GPU_OPERATOR_CP_CACHE=/path build.sh    # another cache root (default ~/.cache/gpu-operator)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

fail() { echo "helm build: $*" >&2; exit 1; }
command -v go >/dev/null || fail "Go is not installed: install Go >= 1.26 (helm v4 needs it) and retry."
version=$(awk '$1 == "helm.sh/helm/v4" {print $2}' "$here/go.mod")
[ -n "$version" ] || fail "no helm.sh/helm/v4 requirement in $here/go.mod"
gover=$(go env GOVERSION | sed 's/^go//')
case "$gover" in 1.2[6-9]*|1.[3-9]*) ;; *) fail "Go $gover is too old: helm $version needs Go >= 1.26.";; esac

# The cache key changes whenever go.mod, go.sum, this script or the Go version changes.
key=$( (cat "$here/go.mod" "$here/go.sum" "$here/build.sh"; echo "$gover") | sha256sum | cut -c1-12)
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

if ! timeout 60 go list -m "helm.sh/helm/v4@$version" >/dev/null 2>&1; then
  fail "cannot reach the Go module proxy ($(go env GOPROXY)) to fetch helm.sh/helm/v4@$version; check network/GOPROXY and retry."
fi
t0=$(date +%s)
echo "helm: [$(date +%H:%M:%S)] building helm $version from Go modules (cold: ~2 min on 2 cores, modules included)" >&2
# The release build's flags (helm's Makefile): the version `helm version` reports, no symbols.
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
tmp=$(mktemp "$out/helm.XXXXXX")
(cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp" helm.sh/helm/v4/cmd/helm) && mv "$tmp" "$out/helm"
echo "helm: [$(date +%H:%M:%S)] done in $(( $(date +%s) - t0 )) s" >&2
echo "$out/helm"
