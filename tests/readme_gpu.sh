#!/usr/bin/env bash
# Runs the command lines the README's "Training on GPUs" section shows, taken from the README
# itself, so the section cannot drift from the binaries (ctest readme_gpu). Without a GPU the
# cuda lines must fail at once with the one line that says so, and gpu-check.sh must skip
# every check (with --allow-no-gpu); with a GPU they must succeed (gpu-check.sh is then left to
# the GPU machine's own run).
#   tests/readme_gpu.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
tmp=$(mktemp -d /tmp/flodl-readme-gpu-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
gpu=0
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi > /dev/null 2>&1; then gpu=1; fi

# The section's sh blocks, comments stripped.
awk '/^## Training on GPUs/{on=1; next} /^## /{on=0} on && /^```sh/{blk=1; next}
     on && /^```/{blk=0} on && blk' "$src/README.md" | sed 's/ *#.*$//' | grep -v '^ *$' \
  > "$tmp/lines"
n=$(wc -l < "$tmp/lines")
[ "$n" -ge 4 ] || fail "the README's GPU section shows $n command lines, expected at least 4"
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
