#!/usr/bin/env bash
# libflodl.so's soname follows the version in include/flodl/flodl.h: for 0.x the minor version
# is part of it (0.1.x: libflodl.so.0.1), since any 0.x minor release may break the ABI; from
# 1.0 on, the major version alone (libflodl.so.1).
#   abi_soname.sh LIBFLODL_SO SOURCE_DIR
set -euo pipefail
lib="$1"; src="$2"
ver() { sed -n "s/^#define FL_VERSION_$1 \([0-9]*\).*/\1/p" "$src/include/flodl/flodl.h"; }
major=$(ver MAJOR); minor=$(ver MINOR)
if [ "$major" = 0 ]; then want="libflodl.so.0.$minor"; else want="libflodl.so.$major"; fi
got=$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
echo "version $major.$minor: soname $got, want $want"
[ "$got" = "$want" ] || { echo "FAIL: soname $got, want $want"; exit 1; }
# The soname's link sits beside the library, as the loader looks for it.
[ -e "$(dirname "$lib")/$want" ] || { echo "FAIL: no $want beside $lib"; exit 1; }
echo "soname ok"
