#!/usr/bin/env bash
# Installs the Debian packages flodl needs, idempotently: only missing packages are installed,
# and apt's index is refreshed only when something is missing.
#   scripts/install-deps.sh            build and test dependencies
#   scripts/install-deps.sh bench      also Open MPI and PyTorch (for the side-by-side benchmarks)
#                                      and iperf3
#   scripts/install-deps.sh image      only what building the binaries needs (container images:
#                                      no test, fuzz or deployment-check tools)
set -euo pipefail

image_pkgs=(build-essential cmake pkg-config libzmq3-dev libprotobuf-c-dev protobuf-c-compiler
            liblz4-dev libcjson-dev zlib1g-dev libopenblas-dev libmicrohttpd-dev)
# Tests: Check, network namespaces, the fuzzer, the deployment checks (Compose's parser,
# YAML and JSON Schema for the Kubernetes manifests), the protocol's conformance test in
# Python (protoc and the protobuf module; libzmq5 comes with libzmq3-dev), and promtool (in
# Debian's prometheus package) for the metrics endpoints, PyTorch for the Python package's
# test (tests/python; about 47 MB installed, with numpy and its other dependencies), and
# clang-format 14 for the formatting check.
build_pkgs=("${image_pkgs[@]}" check libsubunit-dev iproute2 clang libclang-rt-14-dev
            docker-compose python3-yaml python3-jsonschema protobuf-compiler python3-protobuf
            prometheus python3-torch clang-format-14)
bench_pkgs=(openmpi-bin libopenmpi-dev iperf3 python3-torch)

pkgs=("${build_pkgs[@]}")
for group in "$@"; do
  case "$group" in
    bench) pkgs+=("${bench_pkgs[@]}") ;;
    build) ;;
    image) pkgs=("${image_pkgs[@]}") ;;
    *) echo "install-deps.sh: unknown group '$group' (build|bench|image)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "install-deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
