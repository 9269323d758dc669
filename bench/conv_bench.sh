#!/usr/bin/env bash
# Conv + BatchNormalization training step, kiln against PyTorch on the same
# LibTorch (issue 29 §3; docs/PERFORMANCE.md): builds bench/conv_bench and
# runs it with one intra-op thread per core for both (the CPU's instruction
# sets are printed first; compare figures only within one run), twice:
#   1. glibc's malloc defaults, which return each step's freed activations
#      to the kernel and fault them in again (both loops pay it);
#   2. GLIBC_TUNABLES raising the mmap and trim thresholds, which keeps them
#      in the heap: the kernels' own times.
# Usage: bash bench/conv_bench.sh [build dir] [conv_bench options, e.g. --steps 30 --threads 1]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/torch_env.sh
BUILD=build
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then BUILD=$1; shift; fi
cmake --build "$BUILD" --target conv_bench >/dev/null
export KILN_PYTHON   # the peer runs on .venv's torch, the LibTorch kiln links
echo "PyTorch $("$KILN_PYTHON" -c 'import torch; print(torch.__version__)')"
echo "== 1. glibc malloc defaults"
"$BUILD/bench/conv_bench" --threads "$(nproc)" "$@"
echo
echo "== 2. glibc malloc: mmap threshold 32 MiB, trim threshold 1 GiB"
GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824 \
  "$BUILD/bench/conv_bench" --threads "$(nproc)" "$@"
