#!/usr/bin/env bash
# The main job, from a fresh machine: install packages, build, then train the
# Fashion-MNIST MLP (examples/fashion_mnist_mlp.json: validation split,
# EarlyStopping with restore_best_weights), save it as the next version under
# models/fashion_mnist/, and `kiln show` it. Fails unless the test accuracy
# reaches 0.88.
#
# Usage: bash scripts/demo.sh [extra `kiln train` arguments, e.g. --epochs 5]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh

KILN=build/kiln
SPEC=examples/fashion_mnist_mlp.json
MIN_ACCURACY=0.88
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo
echo "== kiln train $SPEC"
start=$(date +%s.%N)
"$KILN" train "$SPEC" "$@" | tee "$log"
version_dir=$(sed -n 's/^Saved model to //p' "$log" | tail -n 1)
accuracy=$(sed -n 's/^test_accuracy: //p' "$log" | tail -n 1)
if [ -z "$version_dir" ] || [ -z "$accuracy" ]; then
  echo "demo: FAILED: kiln train printed no saved path or test accuracy" >&2
  exit 1
fi

echo
echo "== kiln show $version_dir"
"$KILN" show "$version_dir"
end=$(date +%s.%N)

seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
echo
echo "demo: test accuracy $accuracy (needs >= $MIN_ACCURACY), model saved in $version_dir, train + show took ${seconds}s"
if ! awk -v a="$accuracy" -v m="$MIN_ACCURACY" 'BEGIN { exit !(a + 0 >= m + 0) }'; then
  echo "demo: FAILED: test accuracy $accuracy is below $MIN_ACCURACY" >&2
  exit 1
fi

# --- tuning (issue #3): a short Bayesian search with median pruning on a
# Fashion-MNIST subset, the search's summaries, then the final-training
# recipe for the top 2 configurations (saved under models/tuned/<rank>/1).
# A rerun continues the same search (nothing is redone).
echo
echo "== tuning: build/examples/example_fashion_mnist_tune --trials 8 --epochs 3"
tstart=$(date +%s.%N)
build/examples/example_fashion_mnist_tune --trials 8 --epochs 3 --dir build/demo_tuning | tee "$log"
tend=$(date +%s.%N)
echo "demo: tuning took $(awk -v a="$tstart" -v b="$tend" 'BEGIN { printf "%.1f", b - a }')s"
grep -q '^rank 1: ' "$log" || { echo "demo: FAILED: the tuning example retrained nothing" >&2; exit 1; }

# --- ensembling (issue #3): the two retrained configurations plus XGBoost
# trees, weights fitted on held-out validation images; prints every
# member's and the ensemble's test accuracy, saves and reloads the ensemble.
echo
echo "== ensemble: build/examples/example_fashion_mnist_ensemble"
estart=$(date +%s.%N)
build/examples/example_fashion_mnist_ensemble --output models/fashion_mnist_ensemble/1
eend=$(date +%s.%N)
echo "demo: ensembling took $(awk -v a="$estart" -v b="$eend" 'BEGIN { printf "%.1f", b - a }')s"
echo "demo: OK"
