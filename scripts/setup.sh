#!/usr/bin/env bash
# Installs every Debian package kiln's build, tests, benchmarks and demo need.
# Idempotent: does nothing when all are present; runs `apt-get update` only
# when a package is missing.
set -euo pipefail

PACKAGES=(
  # build
  build-essential cmake ninja-build ccache pkg-config clang-format
  clang libclang-rt-dev   # the sanitizer build and libFuzzer (scripts/sanitize.sh)
  libtorch-dev libgloo-dev libopenblas-dev libdnnl-dev   # libdnnl-dev: the int8 GEMM (quantize("int8"))
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
  # peers for golden data and benchmarks
  python3 python3-torch python3-numpy python3-optuna
  python3-flask gunicorn wrk nginx curl nghttp2-client   # nghttp2-client: h2load (bench/serving_bench.sh)
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

# export: the npm packages of web/onnx-check (ONNX Runtime for node, used by
# kiln_export_test to check `kiln export --format onnx`) and web/classifier
# (onnxruntime-web and playwright-core: the browser page and its test);
# skipped when npm is absent or offline (the tests then skip too).
setup_npm() {
  local web dir package dir_package
  web="$(dirname "$0")/../web"
  for dir_package in onnx-check:onnxruntime-node classifier:onnxruntime-web; do
    dir="$web/${dir_package%%:*}"
    package="${dir_package#*:}"
    if command -v npm >/dev/null 2>&1 && [ ! -f "$dir/node_modules/$package/package.json" ]; then
      (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund >/dev/null 2>&1) ||
        echo "setup: npm ci in web/${dir_package%%:*} failed; its test will try again or skip"
    fi
  done
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
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
setup_npm
