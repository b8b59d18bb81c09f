#!/usr/bin/env bash
# Formats flodl's C, header and CUDA sources with clang-format 14 (Debian 12's), the style of
# .clang-format at the root; --check changes nothing and fails naming each file that differs,
# with the first lines of its diff (the test command runs it: ctest format).
#   scripts/format.sh           format the tree in place
#   scripts/format.sh --check   fail on any unformatted file
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "format.sh: unknown argument '$1' (--check or nothing)" >&2; exit 2 ;;
esac
# Another major version formats some constructs differently: only 14 gives the tree's bytes.
cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" > /dev/null && "$c" --version | grep -q 'version 14\.'; then cf=$c; break; fi
done
[ -n "$cf" ] || { echo "format.sh: clang-format 14 not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
cd "$root"
# The tracked sources when this is a git checkout (generated protobuf-c files are not tracked),
# else every source under the tree but the build directories.
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu')
else
  mapfile -t files < <(find . -path './build*' -prune -o -path './.deps' -prune -o \
                         \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print | sed 's|^\./||')
fi
[ ${#files[@]} -gt 0 ] || { echo "format.sh: no sources found under $root" >&2; exit 1; }
if [ $check -eq 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 16 -P "$(nproc)" "$cf" -i
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! out=$("$cf" "$f" | diff -u "$f" - 2>&1); then
    echo "format.sh: $f is not formatted (scripts/format.sh fixes it):"
    head -n 12 <<< "$out"
    bad=$((bad + 1))
  fi
done
if [ $bad -gt 0 ]; then
  echo "format.sh: $bad of ${#files[@]} files are not formatted"
  exit 1
fi
echo "format.sh: ${#files[@]} files formatted"
