#!/usr/bin/env bash
# The python test (tests/python/run.py) under a current PyTorch 2.x from PyPI, in a virtual
# environment kept in .deps/venv-torch2 (or $FLODL_TORCH2_VENV). PyPI's torch wheels are large
# (several GB with their CUDA libraries), so this is not part of the test command: run it after
# a change to python/ or to the cases. Builds build/ first if it has no libflodl.so.
#   scripts/test-torch2.sh [BUILD_DIR] [CASE...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${1:-$root/build}"; [ $# -gt 0 ] && shift
venv="${FLODL_TORCH2_VENV:-$root/.deps/venv-torch2}"
py_host="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  if ! "$py_host" -m venv "$venv"; then
    echo "test-torch2: '$py_host -m venv $venv' failed (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
if ! "$venv/bin/python" -c 'import torch, numpy' 2>/dev/null; then
  echo "== installing torch and numpy from PyPI into $venv"
  "$venv/bin/pip" install -q torch numpy
fi
[ -e "$build/libflodl.so" ] || "$root/scripts/build.sh" "$build" >/dev/null
echo "== $("$venv/bin/python" -c 'import sys, torch; print("Python", sys.version.split()[0], "torch", torch.__version__)')"
FLODL_TEST_PYTHON="$venv/bin/python" exec "$venv/bin/python" "$root/tests/python/run.py" "$build" "$@"
