# Sourced by kiln's scripts: where the pinned LibTorch is (scripts/setup.sh
# installs it). Sets KILN_VENV (the project-local virtual environment holding
# the `torch` wheel and the Python peers of bench/), KILN_PYTHON (its python)
# and KILN_TORCH_PREFIX (torch.utils.cmake_prefix_path, what CMake needs).
# With Torch_DIR set (your own LibTorch), KILN_TORCH_PREFIX is empty and the
# build uses that instead.
KILN_TORCH_VERSION=2.11.0
KILN_VENV=${KILN_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv}
KILN_PYTHON=$KILN_VENV/bin/python
KILN_TORCH_PREFIX=""
if [ -z "${Torch_DIR:-}" ] && [ -x "$KILN_PYTHON" ]; then
  KILN_TORCH_PREFIX=$("$KILN_PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
fi
# The CMake arguments that point a configure step at that LibTorch.
kiln_torch_cmake_args() {
  if [ -n "${Torch_DIR:-}" ]; then
    echo "-DTorch_DIR=$Torch_DIR"
  elif [ -n "$KILN_TORCH_PREFIX" ]; then
    echo "-DCMAKE_PREFIX_PATH=$KILN_TORCH_PREFIX"
  else
    echo "kiln: no LibTorch: run bash scripts/setup.sh (installs the pinned torch wheel into $KILN_VENV), or set Torch_DIR to <libtorch>/share/cmake/Torch" >&2
    return 2
  fi
}
