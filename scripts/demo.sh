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
echo "demo: OK"
