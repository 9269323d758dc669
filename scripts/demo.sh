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

# --- data parallel (issue #11): the same spec on 2 ranks of this machine
# (one core each, Gloo over loopback), global batch 128 split 64 + 64; the
# chief prints the same lines as the single-process run and saves the model.
echo
echo "== kiln launch --nproc_per_node 2 -- kiln train $SPEC --output models/fashion_mnist_dp"
dstart=$(date +%s.%N)
"$KILN" launch --nproc_per_node 2 -- kiln train "$SPEC" --output models/fashion_mnist_dp "$@" | tee "$log"
dend=$(date +%s.%N)
dp_accuracy=$(sed -n 's/^\[rank0\] test_accuracy: //p' "$log" | tail -n 1)
echo "demo: test accuracy: 1 process $accuracy, 2 ranks $dp_accuracy (dropout masks differ, so they agree to" \
  "about a percent); 2 ranks took $(awk -v a="$dstart" -v b="$dend" 'BEGIN { printf "%.1f", b - a }')s"
if ! awk -v a="$dp_accuracy" -v m="$MIN_ACCURACY" 'BEGIN { exit !(a + 0 >= m + 0) }'; then
  echo "demo: FAILED: the data-parallel test accuracy '$dp_accuracy' is below $MIN_ACCURACY" >&2
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

# --- serving (issue #4): serve models/fashion_mnist with kiln serve (REST +
# gRPC), query it over both (gRPC with `kiln predict --grpc`, a
# tensorflow.serving.PredictionService client), deploy a new version by
# dropping a complete directory in the base path, watch the transition, then
# roll back by removing it.
echo
echo "== serving: build/kiln serve --model_name fashion_mnist --model_base_path models/fashion_mnist"
base="$PWD/models/fashion_mnist"
slog=$(mktemp)
"$KILN" serve --model_name fashion_mnist --model_base_path "$base" --port auto --rest_api_port auto \
  --file_system_poll_wait_seconds 1 >"$slog" 2>&1 &
spid=$!
jsonl=$(mktemp)
trap 'kill $spid 2>/dev/null || true; rm -f "$log" "$slog" "$jsonl"' EXIT
for _ in $(seq 1 100); do grep -q 'kiln serve: ready' "$slog" && break; sleep 0.2; done
grep 'kiln serve: ready' "$slog" || { echo "demo: FAILED: kiln serve did not start" >&2; cat "$slog" >&2; exit 1; }
port=$(sed -n 's/.*rest_port=\([0-9]*\).*/\1/p' "$slog" | head -n 1)
grpc_port=$(sed -n 's/.*grpc_port=\([0-9]*\).*/\1/p' "$slog" | head -n 1)
url="http://127.0.0.1:$port/v1/models/fashion_mnist"
status() { curl -s "$url"; echo; }
wait_for() {  # wait until the status JSON contains $1
  for _ in $(seq 1 150); do status | grep -q "$1" && return 0; sleep 0.2; done
  echo "demo: FAILED: the server never reported $1" >&2; status >&2; exit 1
}
echo "GET $url"; status
instance=$(/usr/bin/python3 -c 'print("{\"instances\": [[" + ",".join(["0.5"] * 784) + "]]}")')
echo "POST $url:predict"; curl -s -X POST "$url:predict" -d "$instance"; echo
/usr/bin/python3 -c 'print("[" + ",".join(["0.5"] * 784) + "]"); print("[" + ",".join(["0.0"] * 784) + "]")' >"$jsonl"
grpc_predict() {  # extra arguments: e.g. --model_version N
  echo "gRPC PredictionService/Predict at 127.0.0.1:$grpc_port${*:+ $*} (kiln predict --grpc, two instances)"
  "$KILN" predict --grpc "127.0.0.1:$grpc_port" --model_name fashion_mnist --input "$jsonl" "$@" ||
    { echo "demo: FAILED: the gRPC query failed" >&2; exit 1; }
}
grpc_predict
latest=$(ls "$base" | grep -E '^[0-9]+$' | sort -n | tail -n 1)
next=$((latest + 1))
echo "deploy version $next (a complete copy of version $latest, renamed into place)"
cp -r "$base/$latest" "$base/.tmp-$next" && mv "$base/.tmp-$next" "$base/$next"
wait_for "\"version\":\"$next\",\"state\":\"AVAILABLE\""; status
grpc_predict --model_version "$next"
echo "roll back: remove version $next"
rm -rf "${base:?}/$next"
wait_for "\"version\":\"$latest\",\"state\":\"AVAILABLE\""; status
grpc_predict
grep -E 'serving: fashion_mnist version' "$slog" | sed 's/^/  log: /' | tail -n 12
kill $spid; wait $spid 2>/dev/null || true

# --- quantization (issue #12): the trained model to int8 (per-channel int8
# kernels, per-row int8 inputs, oneDNN's integer GEMM), its test accuracy
# beside the float one, the latency of both through kiln serve (one client,
# REST), then a prediction from the int8 version.
echo
echo "== kiln quantize $version_dir --mode int8 --output models/fashion_mnist_int8"
"$KILN" show --system
"$KILN" quantize "$version_dir" --mode int8 --output models/fashion_mnist_int8 | tee "$log"
int8_dir=$(sed -n 's/^Quantized .* -> //p' "$log" | tail -n 1)
acc() { "$KILN" evaluate "$1" --spec "$SPEC" --json | /usr/bin/python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["accuracy"])'; }
float_acc=$(acc "$version_dir")
int8_acc=$(acc "$int8_dir")
echo "demo: test accuracy float32 $float_acc, int8 $int8_acc"
if ! awk -v a="$float_acc" -v b="$int8_acc" 'BEGIN { d = a - b; exit !(d < 0.005 && d > -0.005) }'; then
  echo "demo: FAILED: int8 accuracy $int8_acc is not within 0.5 point of float32 $float_acc" >&2
  exit 1
fi
printf 'model_config_list {\n  config { name: "float32" base_path: "%s" }\n  config { name: "int8" base_path: "%s" }\n}\n' \
  "$base" "$PWD/models/fashion_mnist_int8" >"$jsonl.config"
"$KILN" serve --model_config_file "$jsonl.config" --port=-1 --rest_api_port auto >"$slog" 2>&1 &
spid=$!
for _ in $(seq 1 100); do grep -q 'kiln serve: ready' "$slog" && break; sleep 0.2; done
grep -q 'kiln serve: ready' "$slog" || { echo "demo: FAILED: kiln serve did not start" >&2; cat "$slog" >&2; exit 1; }
rest=127.0.0.1:$(sed -n 's/.*rest_port=\([0-9]*\).*/\1/p' "$slog" | head -n 1)
build/bench/serving_bench make_request --out "$jsonl.body" >/dev/null
for m in float32 int8; do
  r=$(build/bench/serving_bench load --rest "$rest" --model $m --body "$jsonl.body" --concurrency 1 --seconds 2)
  /usr/bin/python3 -c 'import json,sys; r=json.loads(sys.argv[2]); print("demo: %-7s latency p50 %.3f ms, p99 %.3f ms (one client, REST, %d requests)" % (sys.argv[1], r["p50_ms"], r["p99_ms"], r["ok"]))' "$m" "$r"
done
echo "POST http://$rest/v1/models/int8:predict"
curl -s -X POST "http://$rest/v1/models/int8:predict" -d "$instance"
echo
kill $spid; wait $spid 2>/dev/null || true
rm -f "$jsonl.config" "$jsonl.body"
echo "demo: OK"
