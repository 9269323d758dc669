#!/usr/bin/env bash
# Issue 12's benchmarks in one run, on the CPU at hand (its instruction sets
# are printed first; compare figures only within one run):
#   1. training step of a 4 x Dense(1024) MLP, batch 256: float32,
#      mixed_bfloat16, float8 (emulated) in kiln; float32 and autocast bf16 in
#      PyTorch;
#   2. inference of the same MLP at batch 1/32/256: kiln float32, bfloat16,
#      int8 (the kernel kiln picks; oneDNN, fbgemm, exact forced) against
#      PyTorch float32, bfloat16 and quantize_dynamic (qint8, onednn and x86
#      engines);
#   3. serving: the large serving-bench MLP (784-2048x3-10) as float32,
#      bfloat16 and int8 versions through one `kiln serve` with batching:
#      QPS and p50/p99 (closed loop, 64 clients);
#   4. the main demo's MLP (784-256-256-10, Fashion-MNIST) with kiln fit() in
#      float32 and mixed_bfloat16 against PyTorch float32 (bench/mlp_fit_bench).
#
#   5. the 4 x Dense(1024) MLP trained on Fashion-MNIST in float32 and
#      mixed_bfloat16 (ACCURACY_EPOCHS, default 5): test accuracy, s/epoch.
#
# Usage: [ACCURACY_EPOCHS=5] bash bench/precision_bench.sh [--steps 20] [--seconds 6] [--out DIR] [--skip_fit]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/torch_env.sh
STEPS=20; SECONDS_PER_RUN=6; OUT=build/precision_bench_run; SKIP_FIT=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --skip_fit) SKIP_FIT=1; shift ;;
    *) echo "precision_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
cmake --build build --target kiln_cli precision_bench serving_bench mlp_fit_bench >/dev/null
KILN=$PWD/build/kiln
SB=$PWD/build/bench/serving_bench
PY=$KILN_PYTHON   # .venv: the same torch (LibTorch 2.11) kiln builds against
THREADS=$(nproc)
rm -rf "$OUT"; mkdir -p "$OUT/logs"; OUT=$(cd "$OUT" && pwd)

echo "== kiln: training step and inference"
build/bench/precision_bench --steps "$STEPS" --threads "$THREADS" --json "$OUT/kiln.json" --accuracy_epochs "${ACCURACY_EPOCHS:-5}"
echo
echo "== PyTorch $($PY -c 'import torch; print(torch.__version__)') (same machine, same run)"
$PY bench/precision_peer.py --threads "$THREADS" --steps "$STEPS" >"$OUT/torch.json"
$PY - "$OUT/kiln.json" "$OUT/torch.json" <<'PYEOF'
import json, sys
k = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
print("Training step, batch 256 (ms):  PyTorch float32 %.2f, autocast bf16 %.2f" %
      (t["train_step_ms"]["float32"], t["train_step_ms"]["autocast_bfloat16"]))
print("  kiln mixed_bfloat16 vs kiln float32: %.2fx faster" %
      (k["train_step_ms"]["float32"] / k["train_step_ms"]["mixed_bfloat16"]))
print("Inference (ms per batch)           batch 1   batch 32  batch 256")
for name, row in t["infer_ms"].items():
    print("  PyTorch %-24s %8.3f %10.3f %10.3f" % (name, row["1"], row["32"], row["256"]))
ki = k["infer_ms"]
print("Ratios (time of the other / kiln int8; > 1: kiln int8 is faster)")
for label, ref in (("kiln bfloat16", ki["bfloat16"]), ("kiln float32", ki["float32"]),
                   ("PyTorch quantize_dynamic", t["infer_ms"].get("quantize_dynamic_int8")),
                   ("PyTorch quantize_dynamic x86", t["infer_ms"].get("quantize_dynamic_int8_x86")),
                   ("PyTorch float32", t["infer_ms"]["float32"])):
    if ref:
        print("  %-26s %8.2f %10.2f %10.2f" % ((label,) + tuple(ref[b] / ki["int8"][b] for b in ("1", "32", "256"))))
PYEOF

echo
echo "== serving: the large MLP as float32, bfloat16 and int8 versions (kiln serve, batching, 64 clients)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"$SB" make_model --out "$OUT/repo/large_f32/1" --hidden 2048,2048,2048 >/dev/null
"$SB" make_model --out "$OUT/repo/large_bf16/1" --hidden 2048,2048,2048 --dtype_policy bfloat16 >/dev/null
"$KILN" quantize "$OUT/repo/large_f32/1" --mode int8 --output "$OUT/repo/large_int8_tmp" >/dev/null
mkdir -p "$OUT/repo/large_int8" && mv "$OUT/repo/large_int8_tmp/1" "$OUT/repo/large_int8/1"
"$SB" make_request --out "$OUT/body.json" >/dev/null
{
  echo "model_config_list {"
  for m in large_f32 large_bf16 large_int8; do echo "  config { name: \"$m\" base_path: \"$OUT/repo/$m\" }"; done
  echo "}"
} >"$OUT/models.config"
cat >"$OUT/batching.config" <<EOF2
max_batch_size { value: 32 }
batch_timeout_micros { value: 2000 }
num_batch_threads { value: 1 }
max_enqueued_batches { value: 1000 }
EOF2
"$KILN" serve --model_config_file "$OUT/models.config" --rest_api_port auto --port=-1 \
  --enable_batching --batching_parameters_file "$OUT/batching.config" >"$OUT/logs/serve.out" 2>"$OUT/logs/serve.err" &
PIDS+=($!)
for _ in $(seq 1 600); do grep -q 'kiln serve: ready' "$OUT/logs/serve.out" 2>/dev/null && break; sleep 0.1; done
REST=127.0.0.1:$(sed -n 's/.*rest_port=\([0-9]*\).*/\1/p' "$OUT/logs/serve.out")
printf "  %-12s %10s %10s %10s\n" model QPS p50_ms p99_ms
for m in large_f32 large_bf16 large_int8; do
  "$SB" load --rest "$REST" --model $m --body "$OUT/body.json" --concurrency 64 --seconds 1 >/dev/null  # warm-up
  r=$("$SB" load --rest "$REST" --model $m --body "$OUT/body.json" --concurrency 64 --seconds "$SECONDS_PER_RUN")
  echo "$r" >"$OUT/serving_$m.json"
  $PY -c 'import json,sys; r=json.loads(sys.argv[2]); print("  %-12s %10.0f %10.2f %10.2f   (failed %d)" % (sys.argv[1], r["qps"], r["p50_ms"], r["p99_ms"], r["failed"]))' $m "$r"
done
cleanup; PIDS=()

if [ "$SKIP_FIT" = 0 ]; then
  echo
  echo "== the demo MLP: kiln fit() float32 and mixed_bfloat16 against PyTorch float32"
  build/bench/mlp_fit_bench --epochs 3 --json "$OUT/mlp_fit.json"
fi
