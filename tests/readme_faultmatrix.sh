#!/usr/bin/env bash
# Runs the command lines the README's "Reliability" section shows, taken from the README itself
# (ctest fault_matrix, label faultmatrix): scripts/fault-matrix.sh's default rows against this
# build. The --full line (a 10-minute soak among its rows) is left to be run by hand, saying
# so. Rows that need root or network namespaces skip themselves; any failed row fails the test.
#   tests/readme_faultmatrix.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
fail() { echo "FAIL: $*"; exit 1; }

# The section's sh blocks, comments stripped.
lines=$(awk '/^## Reliability/{on=1; next} /^## /{on=0} on && /^```sh/{blk=1; next}
             on && /^```/{blk=0} on && blk' "$src/README.md" | sed 's/ *#.*$//' | grep -v '^ *$')
grep -qx 'scripts/fault-matrix.sh' <<< "$lines" ||
  fail "the README's Reliability section does not show the line 'scripts/fault-matrix.sh'"
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
