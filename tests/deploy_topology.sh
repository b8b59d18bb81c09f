#!/usr/bin/env bash
# The topology deploy/k8s describes, run in network namespaces on this machine: flodl-ps as the
# ps Deployment runs it (its args from ps.yaml), and the workers of the Indexed Job (args and
# environment from workers.yaml: the rank from JOB_COMPLETION_INDEX, FLODL_HOST the pod's
# address, FLODL_COORDINATOR the Service's name resolved to the ps pod), each in its own
# namespace, with CurveZMQ keys from flodl-keygen laid out as the Secret mounts them. Passes
# when every worker trains to the end and the ps answers /healthz while they do.
#   tests/deploy_topology.sh BUILD_DIR       exit 0 pass, 1 fail, 77 skip (not root, no ip)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: deploy_topology.sh BUILD_DIR}
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root for network namespaces"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: needs iproute2"; exit 77; }
/usr/bin/python3 -c "import yaml" 2>/dev/null || { echo "SKIP: needs python3-yaml"; exit 77; }

# What the manifests run: one line per item (args, then NAME=value environment, for ps and worker).
manifest() {
  /usr/bin/python3 - "$root/deploy/k8s" "$1" "$2" <<'PY'
import sys, yaml
d, which, part = sys.argv[1:4]
for doc in yaml.safe_load_all(open(f"{d}/{which}.yaml")):
    pod = doc.get("spec", {}).get("template", {}).get("spec")
    if not pod:
        continue
    c = pod["containers"][0]
    if part == "args":
        for a in c.get("args", []):
            print(a)
    else:
        for e in c.get("env", []):
            if "value" in e:
                print(f"{e['name']}={e['value']}")
PY
}

pfx="flodlk$$"
rate=10gbit burst=1mb latency=20ms overhead=0 offload=on
tmp=$(mktemp -d)
. "$root/scripts/netns-lib.sh"
trap netns_cleanup EXIT
workers=2
netns_setup "$workers"

# The Secret, as the pods see it: /keys/{server.key,client.key,authorized/client.pub}.
"$build/server/flodl-keygen" "$tmp/gen" >/dev/null
mkdir -p "$tmp/keys/authorized"
cp "$tmp/gen/server.key" "$tmp/gen/client.key" "$tmp/keys/"
cp "$tmp/gen/authorized/client.pub" "$tmp/keys/authorized/"
chmod 600 "$tmp/keys/"*.key

# The ps pod: ps.yaml's args, its $(VAR) references expanded as the kubelet does.
mapfile -t ps_env < <(manifest ps env)
mapfile -t ps_args < <(manifest ps args)
for kv in "${ps_env[@]}"; do export "${kv?}"; done
for i in "${!ps_args[@]}"; do
  ps_args[$i]=$(echo "${ps_args[$i]}" | sed "s/\$(FLODL_WORLD_SIZE)/$FLODL_WORLD_SIZE/")
done
[ "$FLODL_WORLD_SIZE" = "$workers" ] || { echo "FAIL: ps.yaml's world size $FLODL_WORLD_SIZE, this test runs $workers"; exit 1; }
ip netns exec "$(sw_ns)" env FLODL_CURVE_DIR="$tmp/keys" timeout 120 "$build/server/flodl-ps" \
  "${ps_args[@]}" > "$tmp/ps.log" 2>&1 &
ps_pid=$!
pids+=("$ps_pid")

# The worker pods: workers.yaml's args and environment; the Service name resolves to the ps pod.
mapfile -t wk_args < <(manifest workers args)
mapfile -t wk_env < <(manifest workers env)
wk_pids=()
for ((k = 0; k < workers; k++)); do
  env_k=()
  for kv in "${wk_env[@]}"; do
    case "$kv" in
      FLODL_COORDINATOR=*) env_k+=("FLODL_COORDINATOR=tcp://10.77.0.254:29500") ;;
      FLODL_CURVE_DIR=*) env_k+=("FLODL_CURVE_DIR=$tmp/keys") ;;
      *) env_k+=("$kv") ;;
    esac
  done
  # The checkpoint path of the manifest lives on the shared volume: here, the temp dir.
  args_k=()
  for a in "${wk_args[@]}"; do args_k+=("${a//\/checkpoints/$tmp/checkpoints}"); done
  ip netns exec "$(ns_of "$k")" env -i PATH="$PATH" JOB_COMPLETION_INDEX="$k" \
    FLODL_HOST="$(addr "$k")" "${env_k[@]}" timeout 120 "$build/worker/flodl-worker" \
    "${args_k[@]}" --epochs 2 --device cpu > "$tmp/w$k.log" 2>&1 &
  wk_pids+=($!)
  pids+=($!)
done

# The ps's readiness probe, from inside its pod, while the workers train.
health=""
for _ in $(seq 100); do
  health=$(ip netns exec "$(sw_ns)" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9100 && printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && head -1 <&3' 2>/dev/null || true)
  case "$health" in *" 200 "*) break ;; esac
  sleep 0.1
done
status=0
for k in "${!wk_pids[@]}"; do
  wait "${wk_pids[$k]}" || { echo "FAIL: worker $k exited $?"; status=1; }
done
wait "$ps_pid" || { echo "FAIL: flodl-ps exited $?"; status=1; }
pids=()
for k in $(seq 0 $((workers - 1))); do
  grep -q "rank $k summary:" "$tmp/w$k.log" || { echo "FAIL: rank $k did not finish"; status=1; }
done
case "$health" in *" 200 "*) ;; *) echo "FAIL: the ps's /healthz did not answer 200 ($health)"; status=1 ;; esac
if [ $status -ne 0 ]; then
  for f in ps w0 w1; do echo "--- $f"; tail -5 "$tmp/$f.log"; done
  exit 1
fi
echo "deploy topology: ps + $workers workers as deploy/k8s runs them, CurveZMQ, in namespaces:" \
  "$(grep -o 'test accuracy [0-9.]*%' "$tmp/w0.log" | tail -1), /healthz 200"
