#!/usr/bin/env bash
# pip's platform options for the image's Python (CPython 3.11, Debian 12's glibc 2.36) on ARCH
# (amd64 or arm64): printed on one line for `pip download` / `pip install --dry-run`.
set -euo pipefail
case "${ARCH:-amd64}" in
  amd64) machine=x86_64 ;;
  arm64) machine=aarch64 ;;
  *) echo "platforms.sh: unknown ARCH ${ARCH} (amd64 or arm64)" >&2; exit 2 ;;
esac
tags=()
for glibc in 2_36 2_35 2_34 2_31 2_28 2_27 2_26 2_24 2_17; do tags+=("--platform=manylinux_${glibc}_$machine"); done
tags+=("--platform=manylinux2014_$machine" "--platform=linux_$machine")
echo "${tags[*]} --python-version=3.11 --implementation=cp --abi=cp311 --abi=abi3 --abi=none"
