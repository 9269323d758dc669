#!/usr/bin/env bash
# kiln against PyTorch eager on the same device and LibTorch, in one run:
# the training workloads of issue 29's table (4 x Dense(1024) Adam steps in
# float32 and mixed_bfloat16, the Fashion-MNIST-shaped MLP epoch), data
# resident on the device. Prints both sides' lines and a table of ratios
# kiln/PyTorch (below 1: kiln is faster).
#
#   bash bench/gpu_bench.sh [BUILD_DIR] [-- flags for both sides]
#
# BUILD_DIR holds bench/train_gpu_bench (default: build). The peer runs on
# $KILN_PYTHON (scripts/torch_env.sh: the project's .venv) or python3.
# Without a GPU it runs on the CPU; pass small sizes there, e.g.
#   bash bench/gpu_bench.sh build -- --device cpu --sizes 64 --steps 10 --mlp_rows 2560
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [ $# -gt 0 ] && [ "$1" != "--" ]; then BUILD=$1; shift; fi
[ "${1:-}" = "--" ] && shift
. scripts/torch_env.sh
PY=${KILN_PYTHON:-python3}
[ -x "$PY" ] || PY=python3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$BUILD/bench/train_gpu_bench" "$@" | tee "$out/kiln.txt"
"$PY" bench/gpu_peer.py --threads "$(nproc)" "$@" | tee "$out/torch.txt"
echo
echo "| workload | kiln | PyTorch eager | kiln/PyTorch |"
echo "|---|---|---|---|"
while IFS= read -r line; do
  key=${line#kiln }; key=${key%%:*}
  k=$(echo "${line#*: }" | awk '{print $1}'); unit=$(echo "${line#*: }" | awk '{print $2}')
  t=$(grep -F "torch $key:" "$out/torch.txt" | sed 's/.*: //' | awk '{print $1}')
  [ -n "$t" ] || continue
  echo "| $key | $k $unit | $t $unit | $(awk -v a="$k" -v b="$t" 'BEGIN { printf "%.2f", a / b }') |"
done < <(grep '^kiln ' "$out/kiln.txt")
