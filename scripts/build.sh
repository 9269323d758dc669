#!/usr/bin/env bash
# Configures and builds kiln in ./build (Release with line tables) against
# the pinned LibTorch in .venv (scripts/setup.sh), or yours with Torch_DIR set.
# Usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/torch_env.sh
torch_arg=$(kiln_torch_cmake_args)
BUILD_DIR=${KILN_BUILD_DIR:-build}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
# Objects built with the precompiled header are cacheable only with these;
# a fresh clone's headers are all "just modified", which ccache would
# otherwise refuse to trust in direct mode.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja "$torch_arg" "$@" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
