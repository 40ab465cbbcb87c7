#!/usr/bin/env bash
# Puts Prometheus's promtool, from Debian's `prometheus` package, into a versioned cache directory
# and prints the binary's path on the last line of stdout; reuses it when it is there. The chart's
# alert rule tests (tests/unit/chart/test_alert_rules.py) run `promtool test rules` with it.
#
# Why Debian's and not a build from Go modules like tools/helm and tools/controlplane: promtool's
# command pulls every service discovery of Prometheus (AWS, Azure, GCE, Kubernetes, ...), about
# 1,360 packages from 200 modules; a cold build on the project's 2-core machines did not finish in
# 10 minutes, which the cold `./dev test` budget cannot spare (docs/health.md, Alerts). The package
# is only unpacked (dpkg-deb), never installed: no service, no user, no dependencies.
#
#   tools/promtool/get.sh                   # fetch or reuse; prints the binary
#   GPU_OPERATOR_CP_CACHE=/path get.sh      # another cache root (default ~/.cache/gpu-operator)
set -euo pipefail

fail() { echo "promtool: $*" >&2; exit 1; }
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
  || fail "needs apt-get and dpkg-deb (a Debian or Ubuntu machine); elsewhere put a promtool (Prometheus >= 2.42) on PATH as GPU_OPERATOR_PROMTOOL=/path/to/promtool."

candidate() { apt-cache policy prometheus 2>/dev/null | awk '$1 == "Candidate:" {print $2}'; }
version=$(candidate)
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  [ "$(id -u)" = 0 ] || fail "apt knows no 'prometheus' package: run 'apt-get update' as root and retry."
  echo "promtool: updating apt's package lists" >&2
  apt-get update -qq >&2
  version=$(candidate)
  [ -n "$version" ] && [ "$version" != "(none)" ] || fail "no 'prometheus' package in this machine's apt sources."
fi

root=${GPU_OPERATOR_CP_CACHE:-$HOME/.cache/gpu-operator}
out="$root/promtool/$version"
if [ -x "$out/promtool" ]; then
  echo "$out/promtool"; exit 0
fi
mkdir -p "$out"
exec 9>"$out/.lock"  # one fetch per version at a time (two checkouts, or two test processes)
flock 9
if [ -x "$out/promtool" ]; then
  echo "$out/promtool"; exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 777 "$tmp"  # apt fetches as its own user where it can
echo "promtool: fetching Debian's prometheus $version" >&2
if ! (cd "$tmp" && apt-get download -qq "prometheus=$version" >&2 2>/dev/null); then
  # a stale list names a version the archive has replaced: refresh once
  [ "$(id -u)" = 0 ] || fail "could not download prometheus=$version: run 'apt-get update' as root and retry."
  apt-get update -qq >&2
  version=$(candidate); out="$root/promtool/$version"; mkdir -p "$out"
  (cd "$tmp" && apt-get download -qq "prometheus=$version" >&2) || fail "could not download prometheus=$version."
fi
dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
"$tmp/usr/bin/promtool" --version >/dev/null || fail "the unpacked promtool does not run."
mv "$tmp/usr/bin/promtool" "$out/promtool"
echo "$out/promtool"
