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

# --- the seeds' workflow from the command line (issue 16): a short Bayesian
# search over an MLP on the first 55,000 training images, the best 3
# configurations retrained on train + validation for their best epoch x 1.2
# (versions 1..3 of <project>/retrained), a picture of the search, then
# `kiln ensemble`: the three plus XGBoost trees, weights learned by
# Nelder-Mead on the last 5,000 training images (which no member saw),
# every member's and the ensemble's test accuracy in one table. A rerun
# continues the same project (nothing is redone).
WF_SPEC=examples/tune_workflow_mlp.json
WF_DIR=build/demo_tuning/fashion_mnist_workflow
resume=()
[ -f "$WF_DIR/trials.db" ] && resume=(--resume)
echo
echo "== kiln tune $WF_SPEC ${resume[*]} --retrain_top 3 --plot build/demo_tune.svg"
tstart=$(date +%s.%N)
KILN_NUM_THREADS=1 "$KILN" tune "$WF_SPEC" "${resume[@]}" --retrain_top 3 --plot build/demo_tune.svg
tend=$(date +%s.%N)
echo "demo: search + retraining took $(awk -v a="$tstart" -v b="$tend" 'BEGIN { printf "%.1f", b - a }')s" \
  "(the search drawn in build/demo_tune.svg)"

fmnist='{"source": "fashion_mnist", "scale": "1/255", "flatten": true'
echo
echo "== kiln ensemble --members $WF_DIR/retrained/{1,2,3} --xgboost ... --weights nelder_mead"
estart=$(date +%s.%N)
"$KILN" ensemble --members "$WF_DIR/retrained/1" "$WF_DIR/retrained/2" "$WF_DIR/retrained/3" \
  --xgboost "{\"data\": $fmnist, \"limit\": 10000}, \"rounds\": 40, \"max_depth\": 6, \"seed\": 1}" \
  --weights nelder_mead --validation "$fmnist, \"skip\": 55000}" --validation_from train \
  --test "$fmnist}" --output models/fashion_mnist_ensemble | tee "$log"
eend=$(date +%s.%N)
echo "demo: ensembling took $(awk -v a="$estart" -v b="$eend" 'BEGIN { printf "%.1f", b - a }')s"
# The table's test_accuracy column: the ensemble must beat its best member.
read -r best_member ensemble_acc < <(awk '
  $1 == "member" { for (i = 1; i <= NF; i++) if ($i == "test_accuracy") c = i; next }
  c && NF >= c && $1 == "ensemble" { e = $c; next }
  c && NF >= c && $c ~ /^[0-9.]+$/ && $c > b { b = $c }
  END { print b, e }' "$log")
echo "demo: best member $best_member, ensemble $ensemble_acc (test accuracy)"
if ! awk -v m="$best_member" -v e="$ensemble_acc" 'BEGIN { exit !(e + 0 > m + 0) }'; then
  echo "demo: FAILED: the ensemble ($ensemble_acc) does not beat its best member ($best_member)" >&2
  exit 1
fi

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
