#!/usr/bin/env bash
# Installs packages (and the pinned torch wheel into .venv), checks
# formatting, builds kiln against that LibTorch, runs every test (ctest, two
# at a time, each with a time limit), checks the installed package with a
# consumer project, builds and runs the lean build (KILN_FULL=OFF), then runs
# the sanitizer build's suite and a short run of each fuzz target
# (scripts/sanitize.sh).
# Checks that need outside tools (ONNX Runtime, Chromium) must run here, not
# skip (KILN_REQUIRE_CHECKS=1). Where nvcc is installed, the CUDA path
# (kiln/cuda, KILN_CUDA) must be compiled and linked, GPU or not.
# Usage: bash scripts/test.sh [extra ctest arguments, e.g. -R Cli]
#        KILN_SKIP_SANITIZE=1 bash scripts/test.sh   (the plain build only)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/check_format.sh
# Three builds from scratch (GCC, lean, clang with sanitizers): larger unity
# batches cut the compiler's time by a fifth (CMakeLists.txt, KILN_UNITY_BATCH).
export KILN_UNITY_BATCH=${KILN_UNITY_BATCH:-16}
cuda_args=()
if command -v nvcc >/dev/null 2>&1; then cuda_args=(-DKILN_CUDA=ON); fi
bash scripts/build.sh "${cuda_args[@]}"
if command -v nvcc >/dev/null 2>&1; then
  grep -q '^KILN_CUDA:BOOL=ON' build/CMakeCache.txt && [ -f build/libkiln_cuda.so ] && [ -x build/kiln_cuda_test ] || {
    echo "test: nvcc is installed but the CUDA path (kiln/cuda) was not built and linked" >&2
    exit 1
  }
  echo "test: CUDA path built and linked: $(nm -D --defined-only build/libkiln_cuda.so | grep -c ' T ') symbols in libkiln_cuda.so"
fi
export KILN_REQUIRE_CHECKS=1
ctest --test-dir build --output-on-failure -j2 --timeout 900 "$@"
bash scripts/check_install.sh
# The lean build (what scripts/gpu_check.sh builds on a GPU machine): the
# same sources without gRPC, XGBoost, SQLite and the CLI.
KILN_BUILD_DIR=build-lean bash scripts/build.sh -DKILN_FULL=OFF "${cuda_args[@]}"
ctest --test-dir build-lean --output-on-failure -j2 --timeout 900 "$@"
if [ -z "${KILN_SKIP_SANITIZE:-}" ]; then
  bash scripts/sanitize.sh
fi
