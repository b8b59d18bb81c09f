#!/usr/bin/env bash
# Configures and builds flodl into a build directory (default build/), installing the Debian
# dependencies first. Extra arguments go to cmake's configure step. Prints the build directory;
# on failure prints the end of the build log.
#   scripts/build.sh [--deps GROUP] [BUILD_DIR] [-DOPTION=VALUE ...]
# --deps GROUP: the install-deps.sh group to install first (default: build and test
# dependencies; image: only what building needs, as the container images do).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/build"
deps=()
if [ "${1:-}" = "--deps" ]; then deps=("${2:?--deps needs a group}"); shift 2; fi
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then dir="$1"; shift; fi
"$root/scripts/install-deps.sh" "${deps[@]}"
mkdir -p "$dir"
log="$dir/build.log"
if ! { cmake -S "$root" -B "$dir" -DFLODL_WERROR=ON "$@" && cmake --build "$dir" -j "$(nproc)"; } >"$log" 2>&1; then
  echo "build.sh: build failed in $dir; the end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
echo "$dir"
