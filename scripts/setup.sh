#!/usr/bin/env bash
# Installs every Debian package kiln's build, tests, benchmarks and demo need,
# and LibTorch: the pinned `torch` wheel from PyPI (its CUDA build) in a
# project-local virtual environment, .venv (scripts/torch_env.sh), with the
# Python peers of bench/ and the ONNX checks (numpy, Optuna, Flask, gunicorn,
# ONNX Runtime). Idempotent: does nothing when all are present; runs
# `apt-get update` only when a package is missing, pip only when the venv
# lacks a package (pip's cache keeps the wheels between runs).
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake ninja-build ccache pkg-config clang-format
  clang libclang-rt-dev   # the sanitizer build and libFuzzer (scripts/sanitize.sh)
  python3-venv   # .venv: the torch wheel (LibTorch) and the Python peers
  libgloo-dev libdnnl-dev   # Gloo's headers (c10d); libdnnl-dev: the int8 GEMM on VNNI/AMX CPUs (quantize("int8"))
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev zlib1g-dev
  libgtest-dev libgmock-dev
  # tuning and ensembling
  libsqlite3-dev libnlopt-cxx-dev libxgboost-dev
  # plots: kiln/plot draws SVG itself; librsvg renders that SVG as PNG (--plot FILE.png)
  librsvg2-dev
  # serving
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev   # Boost.Beast/Asio (headers only): the REST server
  libcpp-httplib-dev libsimdjson-dev libssl-dev openssl   # openssl: the CLI the TLS tests make certificates with
  # real data
  dataset-fashion-mnist
  # load generators and peers for benchmarks (the Python peers live in .venv)
  python3 wrk nginx curl nghttp2-client   # nghttp2-client: h2load (bench/serving_bench.sh)
  # multi-host tests: network namespaces and veth pairs
  iproute2
  # export: the browser page (web/classifier) in headless Chromium
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# export: the npm packages of web/classifier (onnxruntime-web and
# playwright-core: the browser page and its test), pinned by its
# package-lock.json. Where the npm registry cannot be reached, from the
# offline cache beside the project (../shared/npm-cache, or $KILN_NPM_CACHE),
# which holds exactly those versions. Skipped when npm is absent (the test
# then skips, or fails under KILN_REQUIRE_CHECKS=1 as in scripts/test.sh).
setup_npm() {
  local dir cache
  dir="$(dirname "$0")/../web/classifier"
  command -v npm >/dev/null 2>&1 || return 0
  [ -f "$dir/node_modules/onnxruntime-web/package.json" ] && return 0
  cache=${KILN_NPM_CACHE:-$(cd "$(dirname "$0")/../.." && pwd)/shared/npm-cache}
  if [ -d "$cache" ] && (cd "$dir" && npm ci --offline --cache "$cache" --ignore-scripts --no-audit --no-fund >/dev/null 2>&1); then
    echo "setup: web/classifier's npm packages installed from the offline cache $cache"
  elif (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --fetch-retries=1 >/dev/null 2>&1); then
    echo "setup: web/classifier's npm packages installed from the npm registry"
  else
    echo "setup: npm ci in web/classifier failed (no registry, no offline cache at $cache); its test will skip"
  fi
}

# LibTorch and the Python peers: the pinned torch wheel (the default Linux
# x86_64 wheel on PyPI is the CUDA build) into .venv, once.
setup_venv() {
  # shellcheck source=torch_env.sh
  . "$(dirname "$0")/torch_env.sh"
  local want=("torch==$KILN_TORCH_VERSION" numpy optuna flask gunicorn onnxruntime)
  if [ -x "$KILN_PYTHON" ] && "$KILN_PYTHON" - "$KILN_TORCH_VERSION" <<'PY' 2>/dev/null; then
import importlib.metadata as m, sys
assert m.version("torch").split("+")[0] == sys.argv[1]
for p in ("numpy", "optuna", "flask", "gunicorn", "onnxruntime"):
    m.version(p)
PY
    echo "setup: $KILN_VENV has torch $KILN_TORCH_VERSION and the peers"
    return 0
  fi
  echo "setup: installing torch $KILN_TORCH_VERSION (CUDA build, ~4.5 GB with its CUDA libraries) and the peers into $KILN_VENV"
  [ -x "$KILN_PYTHON" ] || python3 -m venv "$KILN_VENV"
  "$KILN_VENV/bin/pip" install -q "${want[@]}"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  setup_venv
  setup_npm
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
setup_venv
setup_npm
