#!/usr/bin/env bash
# Issue 15 §4, the tail without batching: is it the 2 cores shared between
# server and load generator? Runs the mnist server without batching, its
# closed-loop peak (serving_bench load, 32 connections) and then a fixed
# rate of half that peak, twice each way: "shared" (both free on the 2
# cores) and "pinned" (server on CPU 0, generator on CPU 1, taskset).
# Needs a finished `bash bench/serving_bench.sh` run (its models and body
# under build/serving_bench_run). SERVER_ARGS: extra `kiln serve` flags,
# e.g. "--rest_api_num_threads 1". Prints one line per run.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/serving_bench_run}; K=${KILN:-build/kiln}; SB=${SB:-build/bench/serving_bench}
read -r -a extra <<<"${SERVER_ARGS:-}"
for mode in shared pinned shared pinned; do
  SRV=(); GEN=()
  if [ $mode = pinned ]; then SRV=(taskset -c 0); GEN=(taskset -c 1); fi
  log=$(mktemp)
  "${SRV[@]}" $K serve --model_config_file $OUT/models.config --rest_api_port auto --port=-1 \
    --file_system_poll_wait_seconds 0 "${extra[@]}" >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do grep -q 'kiln serve: ready' "$log" && break; sleep 0.1; done
  port=$(sed -n 's/.*rest_port=\([0-9]*\).*/\1/p' "$log" | head -n 1)
  peak=$("${GEN[@]}" $SB load --rest 127.0.0.1:$port --model mnist --body $OUT/body.json --concurrency 32 --seconds 5)
  half=$(/usr/bin/python3 -c "import json,sys; print(round(0.5*json.loads(sys.argv[1])['qps'],1))" "$peak")
  r=$("${GEN[@]}" $SB load --rest 127.0.0.1:$port --model mnist --body $OUT/body.json --concurrency 32 --seconds 8 --rate $half)
  /usr/bin/python3 -c "import json,sys; p=json.loads(sys.argv[2]); r=json.loads(sys.argv[3]); print('%-7s peak %8.0f/s  half %8.0f/s  p50 %.3f ms p99 %.3f ms p99/p50 %.2f failed %s' % (sys.argv[1], p['qps'], r['qps'], r['p50_ms'], r['p99_ms'], r['p99_ms']/r['p50_ms'], r.get('failed', r.get('errors'))))" $mode "$peak" "$r"
  kill $pid; wait $pid 2>/dev/null || true; rm -f "$log"
done
