#!/usr/bin/env bash
# Installs packages, builds, and runs every test (ctest, two at a time, each
# with a time limit). Usage: bash scripts/test.sh [extra ctest arguments, e.g. -R Cli]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/check_format.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2 --timeout 900 "$@"
