#!/usr/bin/env bash
# Installs packages, checks formatting, builds, runs every test (ctest, two at
# a time, each with a time limit), checks the installed package with a
# consumer project, then runs the sanitizer build's suite and a short run of
# each fuzz target (scripts/sanitize.sh).
# Usage: bash scripts/test.sh [extra ctest arguments, e.g. -R Cli]
#        KILN_SKIP_SANITIZE=1 bash scripts/test.sh   (the plain build only)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/check_format.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2 --timeout 900 "$@"
bash scripts/check_install.sh
if [ -z "${KILN_SKIP_SANITIZE:-}" ]; then
  bash scripts/sanitize.sh
fi
