#!/usr/bin/env bash
# libflodl.so exports exactly the functions declared in include/flodl/*.h: nothing internal
# (fl_* helpers, unprefixed names, protobuf-c's flodl__*, CUDA's), and nothing declared missing.
# The declared names come from the preprocessed headers (the parts in include/flodl/ only), so
# the check follows the headers without a list of its own.
#   abi_exports.sh LIBFLODL_SO SOURCE_DIR [CC]
set -euo pipefail
lib="$1"; src="$2"; cc="${3:-cc}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Every identifier followed by '(' in the headers' own text is a declared function: macros are
# expanded away and function-pointer members read "(*name)(", which does not match.
"$cc" -E -I"$src/include" "$src/include/flodl/flodl.h" |
  awk '/^# [0-9]+ "/ { keep = ($3 ~ /include\/flodl\//); next } keep' | tr '\n' ' ' |
  grep -oE '\b[A-Za-z_][A-Za-z0-9_]*[[:space:]]*\(' | sed 's/[[:space:](]//g' |
  grep -v '^__' | sort -u > "$tmp/declared"
nm -D --defined-only "$lib" | awk '{ print $3 }' | sed 's/@.*//' | sort -u > "$tmp/exported"

echo "$(wc -l < "$tmp/declared") functions declared in include/flodl, $(wc -l < "$tmp/exported") symbols exported"
fail=0
if [ "$(wc -l < "$tmp/declared")" -lt 50 ]; then
  echo "FAIL: found only $(wc -l < "$tmp/declared") declarations: the header scan is broken"
  fail=1
fi
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
if [ -n "$extra" ]; then
  echo "FAIL: $(echo "$extra" | wc -l) exported symbols not declared in include/flodl (first 20):"
  echo "$extra" | head -20 | sed 's/^/  /'
  fail=1
fi
if [ -n "$missing" ]; then
  echo "FAIL: declared in include/flodl but not exported (add them to cmake/flodl.map):"
  echo "$missing" | sed 's/^/  /'
  fail=1
fi
[ "$fail" = 0 ] && echo "exports match the public headers"
exit "$fail"
