# Sourced by the training benchmarks (netns-train.sh, two-level-bench.sh): reads the figures
# of flodl-worker's summary line. The caller sets me (its name, for the messages).

# The figures of rank 0's summary line in LOG, one per field, as "steps acc secs sps compute_ms
# exchange_ms exposed_ms hidden_pct remote_mib"; a field it cannot find fails the script,
# naming the field and showing the line (the worker's summary format is what this reads).
figures() {  # figures LOG
  local line f v out=()
  line=$(grep -m1 '^rank 0 summary: ' "$1") || { echo "$me: no 'rank 0 summary:' line in $1" >&2; return 1; }
  for f in 'epochs, \([0-9][0-9]*\) steps' 'test accuracy \([0-9.][0-9.]*\)%' \
           ', \([0-9.][0-9.]*\) s, [0-9.]* samples/s' ' \([0-9.][0-9.]*\) samples/s' \
           'per step compute \([0-9.][0-9.]*\) ms' 'exchange \([0-9.][0-9.]*\) ms (exposed' \
           '(exposed \([0-9.][0-9.]*\) ms' ', \([0-9][0-9]*\)% hidden' \
           '(\([0-9.][0-9.]*\) MiB to other hosts)'; do
    v=$(sed -n "s|.*$f.*|\1|p" <<<"$line")
    if [ -z "$v" ]; then
      echo "$me: cannot read '$f' from rank 0's summary line:" >&2
      echo "  $line" >&2
      return 1
    fi
    out+=("$v")
  done
  echo "${out[*]}"
}

# Rank 0's first leg inside the host in LOG, from its summary's "first leg inside the host:"
# line: the leg ("host", "copy", "nccl"), then ",overlap" when it ran during the backward pass,
# ",top-k-dev" when each shard's top-k ran on its device, ",gather-dev" when the updated ranges
# were all-gathered on the devices; "-" when there is none (one device, or flat).
first_leg() {  # first_leg LOG
  local line out
  line=$(grep -m1 '^rank 0 first leg inside the host: ' "$1") || { echo -; return 0; }
  line=${line#rank 0 first leg inside the host: }
  out=${line%%,*}
  case "$line" in *"during the backward pass"*) out+=",overlap" ;; esac
  case "$line" in *"top-k on its device"*) out+=",top-k-dev" ;; esac
  case "$line" in *"all-gathered on the devices"*) out+=",gather-dev" ;; esac
  echo "$out"
}
