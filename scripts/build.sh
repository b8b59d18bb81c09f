#!/usr/bin/env bash
# Configures and builds flodl into a build directory (default build/), installing the Debian
# dependencies first. Extra arguments go to cmake's configure step. Prints the build directory;
# on failure prints the end of the build log.
#   scripts/build.sh [BUILD_DIR] [-DOPTION=VALUE ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/build"
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then dir="$1"; shift; fi
"$root/scripts/install-deps.sh"
mkdir -p "$dir"
log="$dir/build.log"
if ! { cmake -S "$root" -B "$dir" -DFLODL_WERROR=ON "$@" && cmake --build "$dir" -j "$(nproc)"; } >"$log" 2>&1; then
  echo "build.sh: build failed in $dir; the end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
echo "$dir"
