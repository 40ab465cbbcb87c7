#!/usr/bin/env bash
# Installs checkov (pinned, with every dependency, by hash: tools/checkov/requirements.txt) into its
# own virtualenv under a versioned cache directory, apart from the project's .venv (checkov's ~100
# dependencies would clash with the project's pins), and prints the checkov executable's path on
# the last line of stdout. Skips the install when that virtualenv is there.
# tests/unit/chart/test_checkov.py calls it; docs/security.md's comparison uses it.
#
#   tools/checkov/build.sh                     # install or reuse; prints the executable
#   tools/checkov/build.sh --lock              # re-resolve requirements.txt for the pin below
#   GPU_OPERATOR_CP_CACHE=/path build.sh       # another cache root (default ~/.cache/gpu-operator)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pin=3.3.30
python=${PYTHON:-python3}

fail() { echo "checkov build: $*" >&2; exit 1; }
command -v "$python" >/dev/null || fail "$python is not installed: install Python 3.11 and retry."
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$pyver" = 3.11 ] || fail "requirements.txt is resolved for Python 3.11, $python is $pyver: set PYTHON=python3.11."

if [ "${1:-}" = --lock ]; then
  tmp=$(mktemp -d)
  "$python" -m venv "$tmp/venv"
  "$tmp/venv/bin/pip" install -q --dry-run --ignore-installed --report "$tmp/report.json" "checkov==$pin"
  "$python" - "$tmp/report.json" "$here/requirements.txt" <<'PY'
import json, sys
items = sorted(json.load(open(sys.argv[1]))["install"], key=lambda i: i["metadata"]["name"].lower())
head = ("# checkov and everything it installs, resolved for CPython 3.11 on Linux x86_64 (the project's\n"
        "# Python); tools/checkov/build.sh installs it with --require-hashes into its own virtualenv.\n"
        "# Regenerate (new checkov pin): tools/checkov/build.sh --lock\n")
body = "".join(f"{i['metadata']['name']}=={i['metadata']['version']} \\\n"
               f"    --hash=sha256:{i['download_info']['archive_info']['hashes']['sha256']}\n" for i in items)
open(sys.argv[2], "w").write(head + body)
PY
  rm -rf "$tmp"; exit 0
fi

# The cache key changes whenever the requirements, this script or the Python version changes.
key=$( (cat "$here/requirements.txt" "$here/build.sh"; echo "$pyver") | sha256sum | cut -c1-12)
root=${GPU_OPERATOR_CP_CACHE:-$HOME/.cache/gpu-operator}
out="$root/checkov-$pin-$key"
mkdir -p "$root"

exec 9>"$out.lock"
if ! flock -n 9; then
  echo "checkov: another install into $out is running; waiting for it" >&2
  flock 9
fi
if [ -x "$out/bin/checkov" ] && [ -e "$out/.installed" ]; then
  echo "$out/bin/checkov"; exit 0
fi
t0=$(date +%s)
echo "checkov: [$(date +%H:%M:%S)] installing checkov $pin into $out (cold: ~2 min)" >&2
rm -rf "$out"
"$python" -m venv "$out"
"$out/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes --only-binary=:all: \
  -r "$here/requirements.txt" >&2 || fail "pip could not install $here/requirements.txt (PyPI reachable?)"
touch "$out/.installed"
echo "checkov: [$(date +%H:%M:%S)] done in $(( $(date +%s) - t0 )) s" >&2
echo "$out/bin/checkov"
