#!/usr/bin/env bash
# Installs the built tree into a scratch prefix, builds examples/consumer (a
# project outside kiln's tree) against it with find_package(kiln COMPONENTS
# training), runs it, and checks that a program that only trains links no
# gRPC, OpenSSL, XGBoost or SQLite. Also builds a one-file program with
# pkg-config. Usage: bash scripts/check_install.sh (after scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/torch_env.sh
BUILD_DIR=${KILN_BUILD_DIR:-build}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cmake --install "$BUILD_DIR" --prefix "$WORK/prefix" >/dev/null
cmake -S examples/consumer -B "$WORK/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$WORK/prefix${KILN_TORCH_PREFIX:+;$KILN_TORCH_PREFIX}" \
  ${Torch_DIR:+-DTorch_DIR=$Torch_DIR} >/dev/null
cmake --build "$WORK/consumer" -j "$(nproc)" >/dev/null
# No LD_LIBRARY_PATH: the installed libraries find each other and LibTorch
# through their RUNPATH ($ORIGIN and LibTorch's folder, CMakeLists.txt's
# kiln_install_rpath), as they must for a user's program.
unset LD_LIBRARY_PATH
# The program, every installed library and the CLI resolve all they link.
for f in "$WORK/consumer/train_mlp" "$WORK"/prefix/lib/libkiln_*.so "$WORK"/prefix/bin/*; do
  [ -e "$f" ] || continue  # no CLI in the lean build
  if ldd "$f" | grep "not found"; then
    echo "check_install: $f cannot find the libraries above (the installed libraries' RUNPATH)" >&2
    exit 1
  fi
done
# What the program and the kiln libraries it loads link directly (NEEDED
# entries). ldd would also list LibTorch's own dependencies, which no kiln
# target can change.
kiln_libs=$(ldd "$WORK/consumer/train_mlp" | awk '/libkiln_/ {print $3}')
if ! echo "$kiln_libs" | grep -q libkiln_training; then
  echo "check_install: train_mlp does not load libkiln_training from the installed tree" >&2
  exit 1
fi
if readelf -d "$WORK/consumer/train_mlp" $kiln_libs | grep NEEDED |
    grep -E "libgrpc|libssl|libcrypto|libxgboost|libsqlite3|libnlopt|libkiln_serving|libkiln_tuning|libkiln_ensemble"; then
  echo "check_install: a training-only program links the libraries above" >&2
  exit 1
fi
(cd "$WORK" && "$WORK/consumer/train_mlp" "$WORK/model")
# pkg-config: the same program, one command line.
PKG_CONFIG_PATH="$WORK/prefix/lib/pkgconfig" \
  g++ examples/consumer/train_mlp.cc -o "$WORK/train_mlp_pc" \
  $(PKG_CONFIG_PATH="$WORK/prefix/lib/pkgconfig" pkg-config --cflags --libs kiln) -Wl,-rpath,"$WORK/prefix/lib"
echo "check_install: installed package, CMake consumer and pkg-config build OK"
