#!/usr/bin/env bash
# Server CPU per request at a fixed rate: the figure that survives a noisy
# 2-core machine, where closed-loop QPS moves with the load generator and
# the neighbours. Starts the mnist server as bench/serving_bench.sh does,
# sends `serving_bench load --rate RATE` (32 connections, 1 s warm-up, then
# 5 s) over REST and then gRPC, and reads the server's utime + stime from
# /proc/PID/stat around the 5 s.
#   bash bench/serving_cpu_per_request.sh RATE [extra kiln serve flags]
# Needs a finished `bash bench/serving_bench.sh` run (models, body and
# batching file under build/serving_bench_run). BATCHING=0: without
# --enable_batching. A/B of one library: LD_LIBRARY_PATH=DIR (the binaries'
# RUNPATH gives way to it), e.g. DIR holding an older libkiln_layers.so.
# Prints one line per protocol.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:?usage: serving_cpu_per_request.sh RATE [kiln serve flags]}
shift
OUT=${OUT:-build/serving_bench_run}; K=${KILN:-build/kiln}; SB=${SB:-build/bench/serving_bench}
batching=(--enable_batching --batching_parameters_file $OUT/batching.config)
[ "${BATCHING:-1}" = 0 ] && batching=()
log=$(mktemp)
$K serve --model_config_file $OUT/models.config --rest_api_port auto --port auto \
  --file_system_poll_wait_seconds 0 "${batching[@]}" "$@" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 300); do grep -q 'kiln serve: ready' "$log" && break; sleep 0.1; done
rest=$(sed -n 's/.*rest_port=\([0-9]*\).*/\1/p' "$log" | head -n 1)
grpc=$(sed -n 's/.*grpc_port=\([0-9]*\).*/\1/p' "$log" | head -n 1)
input=$(/usr/bin/python3 -c "import json,sys; print(next(iter(json.load(open(sys.argv[1]))['signatures']['serving_default']['inputs'])))" \
  $OUT/repo/mnist/1/model.json)
cpu_ticks() { awk '{print $14 + $15}' /proc/$pid/stat; }
for proto in rest grpc; do
  if [ $proto = rest ]; then target=(--rest 127.0.0.1:$rest); else target=(--grpc 127.0.0.1:$grpc --input_name $input); fi
  $SB load "${target[@]}" --model mnist --body $OUT/body.json --concurrency 32 --seconds 1 --rate $RATE >/dev/null
  c0=$(cpu_ticks)
  r=$($SB load "${target[@]}" --model mnist --body $OUT/body.json --concurrency 32 --seconds 5 --rate $RATE)
  c1=$(cpu_ticks)
  /usr/bin/python3 -c "
import json, os, sys
r = json.loads(sys.argv[2]); hz = os.sysconf('SC_CLK_TCK')
print('%-4s %6.0f/s  p50 %.2f ms  p99 %.2f ms  generator late p99 %.2f ms  server CPU %.1f us/request' % (
    sys.argv[1], r['qps'], r['p50_ms'], r['p99_ms'], r.get('late_p99_ms', 0), (int(sys.argv[4]) - int(sys.argv[3])) * 1e6 / hz / r['ok']))" \
    $proto "$r" $c0 $c1
done
