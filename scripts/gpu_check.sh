#!/usr/bin/env bash
# kiln's checks on a machine with an NVIDIA GPU and PyTorch (docs/GPU.md):
# builds kiln's lean build (KILN_FULL=OFF: core, distribute, layers, data,
# training and the CUDA path kiln/cuda) against the LibTorch inside that
# machine's `torch`, runs its whole test suite (the CPU tests on that
# machine's cores and LibTorch, and the *CUDA* tests on the GPU), then the GPU
# benchmarks, and prints one table. Logs go to LOG_DIR.
#
# Usage: bash scripts/gpu_check.sh LOG_DIR [--debs DIR] [--build-dir DIR] [--jobs N]
#        bash scripts/gpu_check.sh --fetch-debs DIR   (on a Debian 12 machine with apt)
#
# The GPU machine needs g++, cmake, nvcc and python3 with torch (CUDA build).
# What it lacks of kiln's other build dependencies (nlohmann-json, protobuf
# and protoc, GoogleTest, zlib's headers, Gloo's headers) can come as Debian
# 12 .deb files in --debs DIR (default .dev/debs, which git ignores):
# `--fetch-debs .dev/debs` downloads them on a machine with apt, and a
# machine without network gets the folder copied along. They are unpacked
# into the build folder, not installed. Budget: 8 minutes on 16 cores.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DEB_PACKAGES=(nlohmann-json3-dev libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler
              libgtest-dev libgmock-dev zlib1g-dev libgloo-dev)

if [ "${1:-}" = "--fetch-debs" ]; then
  dir=${2:?usage: gpu_check.sh --fetch-debs DIR}
  mkdir -p "$dir" && cd "$dir" && apt-get download "${DEB_PACKAGES[@]}"
  exit $?
fi

LOG_DIR=${1:?usage: gpu_check.sh LOG_DIR [--debs DIR] [--build-dir DIR] [--jobs N]}
shift
DEBS=$ROOT/.dev/debs
BUILD=/tmp/kiln-gpu-build
JOBS=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --debs) DEBS=$2; shift 2 ;;
    --build-dir) BUILD=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    *) echo "gpu_check: unknown argument '$1' (usage: gpu_check.sh LOG_DIR [--debs DIR] [--build-dir DIR] [--jobs N])" >&2; exit 2 ;;
  esac
done
mkdir -p "$LOG_DIR"
LOG_DIR=$(cd "$LOG_DIR" && pwd)
PY=${KILN_PYTHON:-python3}
T0=$(date +%s)
ROWS=()
row() { ROWS+=("$(printf '| %-28s | %-8s | %5ss | %s' "$1" "$2" "$(( $(date +%s) - T0 ))" "$3")"); echo "gpu_check: $1: $2 $3"; }
finish() {
  {
    echo
    echo "| step                         | result   | at     | detail"
    echo "|------------------------------|----------|--------|-------"
    printf '%s\n' "${ROWS[@]}"
    if [ -f "$LOG_DIR/gpu_bench.log" ]; then echo; grep '^|' "$LOG_DIR/gpu_bench.log" || true; fi
  } | tee "$LOG_DIR/summary.md"
  exit "${1:-0}"
}

# --- the machine ---------------------------------------------------------
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1
  echo "cores: $(nproc)"; free -g | head -2; grep -m1 "model name" /proc/cpuinfo
  for t in g++ cmake ninja nvcc "$PY"; do printf '%s: ' "$t"; command -v "$t" || echo missing; done
  g++ --version | head -1; cmake --version | head -1; nvcc --version | tail -1
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpu", torch.cuda.is_available())'
} > "$LOG_DIR/machine.log" 2>&1
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
TORCH=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
if [ -z "$TORCH" ]; then
  row machine FAIL "no torch in $PY (set KILN_PYTHON to a python with a CUDA torch)"; finish 1
fi
row machine ok "${GPU:-no GPU seen by nvidia-smi}; torch $TORCH; $(nproc) cores"
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')

# --- dependencies: the system's, else unpacked .deb files ---------------------
DEPS=$BUILD/deps
PREFIXES="$TORCH_PREFIX"
EXTRA=()
need_debs=0
[ -f /usr/include/nlohmann/json.hpp ] || need_debs=1
command -v protoc >/dev/null || need_debs=1
[ -f /usr/include/gtest/gtest.h ] || need_debs=1
[ -f /usr/include/gloo/algorithm.h ] || need_debs=1
if [ $need_debs = 1 ]; then
  if ! ls "$DEBS"/*.deb >/dev/null 2>&1; then
    row dependencies FAIL "missing system packages and no .deb files in $DEBS (gpu_check.sh --fetch-debs $DEBS)"; finish 1
  fi
  rm -rf "$DEPS"; mkdir -p "$DEPS"
  for f in "$DEBS"/*.deb; do dpkg-deb -x "$f" "$DEPS" || { row dependencies FAIL "cannot unpack $f"; finish 1; }; done
  # zlib: the machine's own library, Debian's headers.
  rm -f "$DEPS"/usr/lib/x86_64-linux-gnu/libz.so "$DEPS"/usr/lib/x86_64-linux-gnu/libz.a
  ZLIB=$(ls /usr/lib/x86_64-linux-gnu/libz.so* /lib/x86_64-linux-gnu/libz.so* 2>/dev/null | head -1)
  PREFIXES="$TORCH_PREFIX;$DEPS/usr"
  EXTRA+=(-DProtobuf_PROTOC_EXECUTABLE="$DEPS/usr/bin/protoc" -DKILN_GLOO_INCLUDE="$DEPS/usr/include" ${ZLIB:+-DZLIB_LIBRARY=$ZLIB}
          -DZLIB_INCLUDE_DIR="$DEPS/usr/include")
  export LD_LIBRARY_PATH=$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  row dependencies ok "unpacked $(ls "$DEBS"/*.deb | wc -l) .deb files from $DEBS"
else
  row dependencies ok "from the system"
fi

# --- configure and build --------------------------------------------------
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if ! cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DKILN_FULL=OFF -DKILN_CUDA=ON -DCMAKE_PREFIX_PATH="$PREFIXES" \
    "${EXTRA[@]}" > "$LOG_DIR/configure.log" 2>&1; then
  row configure FAIL "see configure.log: $(grep -m1 -A2 'CMake Error' "$LOG_DIR/configure.log" | tr '\n' ' ' | cut -c1-200)"; finish 1
fi
row configure ok "$(grep -m1 'CUDA path' "$LOG_DIR/configure.log" | sed 's/^-- //')"
if ! timeout 330 cmake --build "$BUILD" -j "$JOBS" > "$LOG_DIR/build.log" 2>&1; then
  row build FAIL "see build.log: $(grep -m3 -E 'error|FAILED' "$LOG_DIR/build.log" | tr '\n' ' ' | cut -c1-300)"; finish 1
fi
row build ok "$(ls "$BUILD"/kiln_*_test | wc -l) test binaries"

# --- the whole lean suite, then the CUDA tests with their own log -------------
status=0
(cd "$BUILD" && timeout 200 ctest -j "$(( JOBS / 2 > 1 ? JOBS / 2 : 1 ))" --timeout 180 --output-on-failure) \
  > "$LOG_DIR/ctest.log" 2>&1 || status=1
row "lean suite (ctest)" "$([ $status = 0 ] && echo ok || echo FAIL)" \
  "$(grep -E 'tests passed|tests failed' "$LOG_DIR/ctest.log" | tail -1)"
: > "$LOG_DIR/cuda_tests.log"
for t in "$BUILD"/kiln_*_test; do
  echo "== $(basename "$t")" >> "$LOG_DIR/cuda_tests.log"
  "$t" --gtest_filter='*CUDA*' --gtest_brief=1 >> "$LOG_DIR/cuda_tests.log" 2>&1 || status=1
done
cuda_passed=$(grep -o 'PASSED  \] [0-9]*' "$LOG_DIR/cuda_tests.log" | awk '{s+=$3} END {print s+0}')
cuda_failed=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$LOG_DIR/cuda_tests.log")
cuda_skipped=$(grep -o 'SKIPPED \] [0-9]* test' "$LOG_DIR/cuda_tests.log" | awk '{s+=$3} END {print s+0}')
row "*CUDA* tests" "$([ "$cuda_failed" = 0 ] && [ "$cuda_passed" -gt 0 ] && echo ok || echo FAIL)" \
  "$cuda_passed passed, $cuda_failed failed, $cuda_skipped skipped"
[ "$cuda_failed" = 0 ] && [ "$cuda_passed" -gt 0 ] || status=1

# --- GPU benchmarks: kiln against PyTorch eager in one run -------------------
if [ -x "$BUILD/bench/train_gpu_bench" ]; then
  if KILN_PYTHON="$PY" timeout 240 bash "$ROOT/bench/gpu_bench.sh" "$BUILD" > "$LOG_DIR/gpu_bench.log" 2>&1; then
    row "gpu_bench.sh" ok "$(grep -c '^| [a-z]' "$LOG_DIR/gpu_bench.log") workloads; table in gpu_bench.log"
  else
    row "gpu_bench.sh" FAIL "see gpu_bench.log"; status=1
  fi
fi
finish $status
