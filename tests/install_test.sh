#!/usr/bin/env bash
# Installs the build into a temporary prefix, checks the package metadata (flags, license),
# builds examples/allreduce_env.c against it three times (pkg-config for libflodl.so and for
# libflodl.a, and CMake's find_package), and runs each with the installed flodl-ps and two
# ranks configured through the environment, as a user's launcher would.
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"; src="$2"
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
prefix="$tmp/prefix"
libdir=$(dirname "$(find "$prefix" -name 'libflodl.so' | head -1)")
export PKG_CONFIG_PATH="$libdir/pkgconfig"
export LD_LIBRARY_PATH="$libdir"

echo "pkg-config: $(pkg-config --modversion flodl) $(pkg-config --cflags --libs flodl)"
# A consumer compiles with flodl's headers alone: the private dependencies' include flags
# (libzmq's krb5, pgm, libxml2) stay out, while --static still names every library.
for f in $(pkg-config --cflags flodl); do
  if [ "${f#-I}" = "$f" ] || [ "$(realpath "${f#-I}")" != "$(realpath "$prefix/include")" ]; then
    echo "FAIL: pkg-config --cflags flodl gives $f besides -I$prefix/include"; exit 1
  fi
done
pkg-config --static --libs flodl | grep -qw -- -lzmq ||
  { echo "FAIL: pkg-config --static --libs flodl lacks -lzmq"; exit 1; }
# The license: in the package metadata and installed beside the documentation.
[ "$(pkg-config --variable=license flodl)" = "Apache-2.0" ] ||
  { echo "FAIL: flodl.pc license '$(pkg-config --variable=license flodl)'"; exit 1; }
grep -q "Apache License" "$prefix/share/doc/flodl/LICENSE" ||
  { echo "FAIL: no Apache LICENSE in $prefix/share/doc/flodl"; exit 1; }
read -ra pcflags <<< "$(pkg-config --cflags --libs flodl)"
cc -std=c17 -Wall -Werror -o "$tmp/ex_pc" "$src/examples/allreduce_env.c" "${pcflags[@]}" -lm
# libflodl.a with what --static names (Libs.private) links too.
read -ra pcstatic <<< "$(pkg-config --cflags --static --libs flodl | sed 's/-lflodl\b//')"
cc -std=c17 -Wall -Werror -o "$tmp/ex_static" "$src/examples/allreduce_env.c" \
  "$libdir/libflodl.a" "${pcstatic[@]}" -lm
# find_package(flodl) for the shared library needs no CUDA toolkit, whatever libflodl was
# built with (libflodl.so carries the CUDA runtime it uses).
cmake -S "$src/examples" -B "$tmp/exbuild" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON > "$tmp/excfg" ||
  { cat "$tmp/excfg"; echo "FAIL: find_package(flodl) without a CUDA toolkit"; exit 1; }
grep -q "license Apache-2.0" "$tmp/excfg" ||
  { cat "$tmp/excfg"; echo "FAIL: the CMake package does not give flodl_LICENSE"; exit 1; }
cmake --build "$tmp/exbuild" >/dev/null

run_job() {
  local prog="$1"
  "$prefix/bin/flodl-ps" --bind tcp://127.0.0.1:0 --world-size 2 --endpoint-file "$tmp/ep" \
    --log-level warn --insecure &
  local ps=$!
  pids+=("$ps")
  for _ in $(seq 100); do [ -s "$tmp/ep" ] && break; sleep 0.05; done
  local ep
  ep=$(cat "$tmp/ep")
  FLODL_RANK=0 FLODL_WORLD_SIZE=2 FLODL_COORDINATOR="$ep" timeout 60 "$prog" > "$tmp/r0" &
  local r0=$!
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="${ep##*:}" timeout 60 "$prog" > "$tmp/r1" &
  local r1=$!
  pids+=("$r0" "$r1")
  wait "$r0"; wait "$r1"; wait "$ps"
  grep -q "rank 0 of 2: averaged 100000 floats, ok" "$tmp/r0"
  grep -q "rank 1 of 2: averaged 100000 floats, ok" "$tmp/r1"
  rm -f "$tmp/ep"
  echo "$(basename "$prog"): ok"
}
run_job "$tmp/ex_pc"
run_job "$tmp/ex_static"
run_job "$tmp/exbuild/allreduce_env"
echo "install test passed"
