#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet as one
# multicall binary; etcd; kwok; the real node's pause) from Go modules into a versioned cache directory, and prints
# that directory on the last line of stdout. Skips everything already built. Also builds the oldest
# Kubernetes we support (KUBE_FLOOR_VERSION: apiserver, controller-manager, scheduler) into a cache
# directory of its own, linked from the first as bin/kube-floor, so a new floor rebuilds only itself.
#
#   tools/controlplane/build.sh            # build or reuse; prints the cache dir
#   tools/controlplane/build.sh --without-floor   # only what the current Kubernetes needs (the demo,
#                                          # everything but tests/floor); a later run adds the floor
#   GPU_OPERATOR_CP_CACHE=/path build.sh   # another cache root (default ~/.cache/gpu-operator)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=kube-floor/version.env
source "$here/kube-floor/version.env"
with_floor=1
case "${1:-}" in
  --without-floor) with_floor=0 ;;
  "") ;;
  *) echo "controlplane build: unknown argument $1 (usage: build.sh [--without-floor])" >&2; exit 2 ;;
esac

fail() { echo "controlplane build: $*" >&2; exit 1; }
command -v go >/dev/null || fail "Go is not installed: install Go >= 1.26 (the module needs it) and retry."
gover=$(go env GOVERSION | sed 's/^go//')
case "$gover" in 1.2[6-9]*|1.[3-9]*) ;; *) fail "Go $gover is too old: kube $KUBE_VERSION and kwok $KWOK_VERSION need Go >= 1.26.";; esac

# The cache key changes whenever a version or a go.sum changes.
multicall=("$here/multicall/go.mod" "$here/multicall/go.sum" "$here/multicall/multicall.go")
key=$( (cat "$here/versions.env" "$here/kube/go.sum" "$here/etcd/go.sum" "$here/kube/main.go" "$here/kube/pause/main.go" "$here/etcd/main.go" "${multicall[@]}"; echo "$gover") | sha256sum | cut -c1-12)
root=${GPU_OPERATOR_CP_CACHE:-$HOME/.cache/gpu-operator}
out="$root/controlplane/${KUBE_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}-$key"
mkdir -p "$out/bin"
# (the floor's version.env without its comments: a comment edit rebuilds nothing)
floorkey=$( (grep -v '^#' "$here/kube-floor/version.env"; cat "$here/kube-floor/go.sum" "$here/kube-floor/main.go" "${multicall[@]}"; echo "$KUBE_FLOOR_VERSION $gover") | sha256sum | cut -c1-12)
floor="$root/controlplane/floor-${KUBE_FLOOR_VERSION}-$floorkey"

# One build per cache directory at a time: two checkouts (or a test run and a setup) building
# at once would both write the same temporary outputs. The second waits, then reuses.
exec 9>"$out/.build.lock"
if ! flock -n 9; then
  echo "controlplane: another build of $out is running; waiting for it" >&2
  flock 9
fi

floor_ready() { [ -x "$floor/kube" ] && [ "$(readlink "$out/bin/kube-floor")" = "$floor/kube" ]; }
if [ -x "$out/bin/kube" ] && [ -x "$out/bin/pause" ] && [ -x "$out/bin/etcd" ] && [ -x "$out/bin/kwok" ] && [ -d "$out/stages" ] \
   && { [ "$with_floor" = 0 ] || floor_ready; }; then
  echo "controlplane: reusing $out" >&2
  echo "$out"; exit 0
fi

# Fail fast when the module proxy is out of reach rather than hanging in a build.
if ! timeout 60 go list -m "sigs.k8s.io/kwok@$KWOK_VERSION" >/dev/null 2>&1; then
  fail "cannot reach the Go module proxy ($(go env GOPROXY)) to fetch sigs.k8s.io/kwok@$KWOK_VERSION; check network/GOPROXY and retry."
fi

export CGO_ENABLED=0
step() { echo "controlplane: [$(date +%H:%M:%S)] $*" >&2; }
t0=$(date +%s)

if [ ! -x "$out/bin/etcd" ]; then
  step "building etcd $ETCD_VERSION"
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd.tmp" .) && mv "$out/bin/etcd.tmp" "$out/bin/etcd"
fi

if [ ! -x "$out/bin/kwok" ]; then
  step "building kwok $KWOK_VERSION"
  GOBIN="$out/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
if [ ! -d "$out/stages" ]; then
  # kwok's default "fast" stages, from the module just fetched (referenced, not committed).
  moddir=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION
  [ -d "$moddir/kustomize/stage" ] || (cd "$here/etcd" && go mod download "sigs.k8s.io/kwok@$KWOK_VERSION")
  mkdir -p "$out/stages.tmp"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [ -f "$moddir/kustomize/stage/$f" ] || fail "kwok stage $f not found in $moddir"
    cp "$moddir/kustomize/stage/$f" "$out/stages.tmp/$(echo "$f" | tr / _)"
  done
  chmod -R u+w "$out/stages.tmp"; mv "$out/stages.tmp" "$out/stages"
fi

if [ ! -x "$out/bin/kube" ]; then
  minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
  step "building kube-apiserver/controller-manager/scheduler/kubelet $KUBE_VERSION (cold: ~4-6 min on 2 cores)"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$here/kube" && go build -trimpath -ldflags "$ldflags" -o "$out/bin/kube.tmp" .) && mv "$out/bin/kube.tmp" "$out/bin/kube"
fi
if [ ! -x "$out/bin/pause" ]; then
  # The real node's sandbox process (static, a few hundred KB): packed into a local image.
  (cd "$here/kube" && go build -trimpath -ldflags "-s -w" -o "$out/bin/pause.tmp" ./pause) && mv "$out/bin/pause.tmp" "$out/bin/pause"
fi
if [ "$with_floor" = 1 ] && [ ! -x "$floor/kube" ]; then
  step "building the floor, kube-apiserver/controller-manager/scheduler $KUBE_FLOOR_VERSION (cold: ~4 min on 2 cores)"
  mkdir -p "$floor"
  minor=$(echo "$KUBE_FLOOR_VERSION" | cut -d. -f2)
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_FLOOR_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  tmp=$(mktemp "$floor/kube.XXXXXX")
  (cd "$here/kube-floor" && go build -trimpath -ldflags "$ldflags" -o "$tmp" .) && mv "$tmp" "$floor/kube"
fi
if [ -x "$floor/kube" ]; then ln -sfn "$floor/kube" "$out/bin/kube-floor"; fi
step "done in $(( $(date +%s) - t0 )) s"
echo "$out"
