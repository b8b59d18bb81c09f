#!/usr/bin/env bash
# Runs the command lines docs/reliability.md shows (the page tests/doc_lines.py gives this
# runner), taken from the page itself (ctest fault_matrix, label faultmatrix):
# scripts/fault-matrix.sh's default rows against this build. Every other line of the page runs
# too, but the --full line (a long soak among its rows), left to be run by hand, saying
# so. Rows that need root or network namespaces skip themselves; any failed row fails the test.
#   tests/readme_faultmatrix.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
fail() { echo "FAIL: $*"; exit 1; }

# The page's sh blocks, comments stripped, continuations joined.
lines=$(python3 "$src/tests/doc_lines.py" "$src" --runner fault_matrix --bare) ||
  fail "tests/doc_lines.py: $lines"
grep -qx 'scripts/fault-matrix.sh' <<< "$lines" ||
  fail "docs/reliability.md does not show the line 'scripts/fault-matrix.sh'"
cd "$src" || fail "no $src"
status=0
while IFS= read -r line; do
  case "$line" in
    *--full*) echo "skip (the whole matrix, run by hand): $line"; continue ;;
  esac
  echo "run: $line"
  FLODL_BUILD_DIR=$build timeout 840 bash -c "$line" < /dev/null
  rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: '$line' exited $rc"; status=1; }
done <<< "$lines"
[ $status -eq 0 ] && echo PASS
exit $status
