#!/usr/bin/env bash
# Runs the command lines docs/gpus.md shows (the page tests/doc_lines.py gives this runner),
# taken from the page itself, so it cannot drift from the binaries (ctest readme_gpu). Every
# line runs; without a GPU the cuda lines must fail at once with the one line that says so, and
# gpu-check.sh must skip every check (with --allow-no-gpu); with a GPU they must succeed
# (gpu-check.sh is then left to the GPU machine's own run).
#   tests/readme_gpu.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
tmp=$(mktemp -d /tmp/flodl-readme-gpu-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
gpu=0
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi > /dev/null 2>&1; then gpu=1; fi

# The page's sh blocks, comments stripped, continuations joined.
python3 "$src/tests/doc_lines.py" "$src" --runner readme_gpu --bare > "$tmp/lines" ||
  fail "tests/doc_lines.py: $(cat "$tmp/lines")"
n=$(wc -l < "$tmp/lines")
[ "$n" -ge 4 ] || fail "docs/gpus.md shows $n command lines, expected at least 4"
grep -q 'gpu-check\.sh' "$tmp/lines" ||
  fail "docs/gpus.md does not show the scripts/gpu-check.sh line"
grep -q -- '--device sim' "$tmp/lines" || fail "docs/gpus.md does not show a --device sim line"
cd "$src" || fail "no $src"
i=0
while IFS= read -r line; do
  i=$((i + 1))
  cmd=${line//.\/build\//$build\/}
  case "$cmd" in
    *gpu-check.sh*)
      [ $gpu -eq 1 ] && { echo "skip (a GPU is here): $line"; continue; }
      cmd="$cmd --allow-no-gpu --build-dir $tmp/bg" ;;
  esac
  out=$(timeout 300 bash -c "$cmd" < /dev/null 2>&1)
  rc=$?
  case "$line" in
    *--device\ cuda*)
      if [ $gpu -eq 1 ]; then
        [ $rc -eq 0 ] || fail "'$line' exited $rc on a GPU machine: $(tail -3 <<< "$out")"
      else
        [ $rc -ne 0 ] || fail "'$line' succeeded without a GPU"
        grep -q "no usable GPU" <<< "$out" || fail "'$line' does not say why: $(tail -3 <<< "$out")"
      fi ;;
    *)
      [ $rc -eq 0 ] || fail "'$line' exited $rc: $(tail -5 <<< "$out")" ;;
  esac
  echo "ok: $line"
done < "$tmp/lines"
echo PASS
