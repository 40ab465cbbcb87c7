#!/usr/bin/env bash
# The build environment of our wheel (tools/image/build.sh): a virtualenv with pip, setuptools,
# wheel and packaging installed from WHEELS alone (no index) with --require-hashes against
# tools/image/build-requirements.lock, so a wheel whose bytes differ from the pinned ones is
# refused, never built with.
#   tools/image/buildenv.sh WHEELS VENV
set -euo pipefail
cd "$(dirname "$0")/../.."
wheels=${1:?usage: tools/image/buildenv.sh WHEELS VENV}
venv=${2:?usage: tools/image/buildenv.sh WHEELS VENV}
py=${PYTHON:-$PWD/.venv/bin/python}
"$py" -m venv --clear --without-pip "$venv"  # pip too comes from the lock, installed by ours
PIP_FIND_LINKS="" "$py" -m pip --python "$venv/bin/python" install -q --disable-pip-version-check --no-index \
  --find-links "$wheels" --only-binary=:all: --require-hashes -r tools/image/build-requirements.lock
