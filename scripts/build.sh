#!/usr/bin/env bash
# Configures and builds flodl into a build directory (default build/), installing the Debian
# dependencies first. Extra arguments go to cmake's configure step.
#   scripts/build.sh [BUILD_DIR] [-DOPTION=VALUE ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/build"
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then dir="$1"; shift; fi
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$dir" -DFLODL_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j "$(nproc)" >/dev/null
echo "$dir"
