#!/usr/bin/env bash
# kiln's tuners vs Optuna's TPE (bench/tune_bench.py): same space, budget and
# external training program. Usage: bench/tune_bench.sh [--trials N] [--epochs E]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build --target kiln_cli example_tune_trial_mlp >/dev/null
build/kiln show --system | head -n 3   # figures compare only within one run on one CPU
. scripts/torch_env.sh
exec "$KILN_PYTHON" bench/tune_bench.py "$@"   # .venv: Optuna
