#!/usr/bin/env bash
# Builds the simulator's OCI registry (main.go here: go-containerregistry's registry handler with
# TLS and basic auth, modules pinned in go.mod/go.sum) into a versioned cache directory and prints
# the binary's path on the last line of stdout. Skips the build when that binary is there.
# `gpu-operator sim up --registry` and the tests that need a registry run it.
#
#   tools/registry/build.sh                     # build or reuse; prints the binary
#   GPU_OPERATOR_CP_CACHE=/path build.sh        # another cache root (default ~/.cache/gpu-operator)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

fail() { echo "registry build: $*" >&2; exit 1; }
command -v go >/dev/null || fail "Go is not installed: install Go >= 1.26 and retry."
version=$(awk '$1 == "github.com/google/go-containerregistry" {print $2}' "$here/go.mod")
[ -n "$version" ] || fail "no github.com/google/go-containerregistry requirement in $here/go.mod"
gover=$(go env GOVERSION | sed 's/^go//')
case "$gover" in 1.2[6-9]*|1.[3-9]*) ;; *) fail "Go $gover is too old: go.mod asks for Go >= 1.26.";; esac

# The cache key changes whenever the sources, go.mod, go.sum, this script or the Go version change.
key=$( (cat "$here/go.mod" "$here/go.sum" "$here/main.go" "$here/build.sh"; echo "$gover") | sha256sum | cut -c1-12)
root=${GPU_OPERATOR_CP_CACHE:-$HOME/.cache/gpu-operator}
out="$root/registry/ggcr-$version-$key"
mkdir -p "$out"

exec 9>"$out/.build.lock"
if ! flock -n 9; then
  echo "registry: another build of $out is running; waiting for it" >&2
  flock 9
fi
if [ -x "$out/registry" ]; then
  echo "$out/registry"; exit 0
fi

if ! timeout 60 go mod download -json "github.com/google/go-containerregistry@$version" >/dev/null 2>&1; then
  fail "cannot reach the Go module proxy ($(go env GOPROXY)) to fetch go-containerregistry@$version; check network/GOPROXY and retry."
fi
t0=$(date +%s)
echo "registry: [$(date +%H:%M:%S)] building the registry (go-containerregistry $version) from Go modules (cold: ~40 s on 2 cores, modules included)" >&2
tmp=$(mktemp "$out/registry.XXXXXX")
(cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp" .) && mv "$tmp" "$out/registry"
echo "registry: [$(date +%H:%M:%S)] done in $(( $(date +%s) - t0 )) s" >&2
echo "$out/registry"
