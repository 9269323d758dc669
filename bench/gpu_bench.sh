#!/usr/bin/env bash
# kiln against PyTorch eager on the same device and LibTorch, in one run
# (issue 29): bench/train_gpu_bench (kiln) and bench/gpu_peer.py (PyTorch)
# run the same workloads, data resident on the device:
#   dense        4 x Dense(1024) Adam steps, float32 and mixed_bfloat16
#   mlp          the Fashion-MNIST-shaped MLP (784-256-256-10) epoch
#   conv         Keras's simple MNIST convnet epoch (batch 128)
#   transformer  an attention + MLP block train step in mixed_bfloat16
#                (d_model 1024, 16 heads, seq 512, batch 32), its model FLOP
#                utilization against a bf16 matmul measured in the same run
#   float8       4 x Dense(8192) at batch 8192: float8 training against bf16
#                (the peer's float8 needs _scaled_mm on compute capability 8.9+)
#   pipeline     kiln only: the MLP epoch fed from host tensors through fit()
#                and from a Dataset, against tensors already on the device
# Prints both sides' lines, then one table: a row per kiln line, with
# PyTorch's value and the ratio kiln/PyTorch (below 1: kiln is faster) where
# the peer printed the same key, "-" where it has none (pipeline, ratios).
# Defaults take about a minute on an H200 (scripts/gpu_check.sh allows 240 s).
#
#   bash bench/gpu_bench.sh [BUILD_DIR] [-- flags for both sides]
#
# BUILD_DIR holds bench/train_gpu_bench (default: build; the lean build
# -DKILN_FULL=OFF builds it too). Flags (both sides; train_gpu_bench.cc's
# header lists them): --device, --workloads, --sizes, --steps, --policies,
# --mlp_rows, --conv_rows, --tf_batch, --tf_seq, --tf_d_model, --tf_heads,
# --tf_steps, --peak_n, --f8_width, --f8_batch, --f8_steps. The peer runs on
# $KILN_PYTHON if set, else the project's .venv (scripts/torch_env.sh), else
# python3. Without a GPU it runs on the CPU; pass small sizes there (about
# 2 minutes on 2 cores):
#   bash bench/gpu_bench.sh build -- --device cpu --sizes 64 --steps 10 --mlp_rows 2560 \
#     --conv_rows 1280 --tf_batch 4 --tf_seq 64 --tf_d_model 128 --tf_heads 4 --tf_steps 3 \
#     --peak_n 512 --f8_width 256 --f8_batch 64 --f8_steps 5
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [ $# -gt 0 ] && [ "$1" != "--" ]; then BUILD=$1; shift; fi
[ "${1:-}" = "--" ] && shift
PY=${KILN_PYTHON:-}  # scripts/gpu_check.sh names the machine's python; torch_env.sh would replace it
. scripts/torch_env.sh
PY=${PY:-$KILN_PYTHON}
[ -x "$PY" ] || command -v "$PY" >/dev/null || PY=python3
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
  t=$(grep -F "torch $key:" "$out/torch.txt" | sed 's/.*: //' | awk '{print $1}' || true)
  if [ -z "$t" ]; then
    echo "| $key | $k $unit | - | - |"
  else
    echo "| $key | $k $unit | $t $unit | $(awk -v a="$k" -v b="$t" 'BEGIN { printf "%.2f", a / b }') |"
  fi
done < <(grep '^kiln ' "$out/kiln.txt")
grep '^torch float8 skipped' "$out/torch.txt" || true
