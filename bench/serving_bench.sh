#!/usr/bin/env bash
# The serving benchmark of issue #4, all peers in one run, one results table:
#   - in-process bound: ModelServable::predict on batches (what the batch
#     threads call), rows/s at batch 1 and at max_batch_size;
#   - kiln serve without and with batching: REST (wrk, closed loop) and gRPC
#     (bench/serving_bench load --grpc, closed loop);
#   - the peer: Flask + PyTorch under gunicorn serving the same weights (wrk);
#   - p50/p99 at half the peak QPS (fixed-rate generator, REST and gRPC, batching);
#   - 50 version swaps under REST load (failed requests must be 0);
#   - latency of model A at a fixed rate while model B reloads back to back;
#   - issue 15 §4, the front ends against the machine's HTTP ceiling: nginx
#     `return 200` (started here, measured first and last, mean used) and,
#     with the same wrk -t2 -c32, kiln's empty GET /v2/health/live and one-row
#     REST predict; gRPC Predict driven by h2load (raw HTTP/2 POSTs of a
#     framed PredictRequest, bench/serving_h2load.py) next to the synchronous
#     C++ clients; p50/p99 at half the peak without batching too.
# Models: the Fashion-MNIST MLP (784-256-256-10, trained briefly with
# `kiln train`) and a larger MLP (784-2048-2048-2048-10, random weights).
#
# Usage: [CONNECTIONS=32] [LARGE_CONNECTIONS=64] [BUILD_DIR=build] [KILN=BUILD_DIR/kiln] [MODEL_CACHE=DIR]
#        [REST_THREADS=auto|default|N] bash bench/serving_bench.sh [--seconds 8] [--out DIR] [--no-build]
# BUILD_DIR holds kiln and bench/serving_bench (configured with
# KILN_BENCH_AND_EXAMPLES=ON); --no-build uses them as they are.
# REST_THREADS: --rest_api_num_threads. auto: clients + 16 for a server with
# a thread per connection, the server's own default for an event-driven one
# (whose --help calls them I/O threads); default: never pass the flag.
# Needs wrk, h2load, nginx, and gunicorn, Flask and torch in .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/torch_env.sh

SECONDS_PER_RUN=8
OUT=build/serving_bench_run
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    *) echo "serving_bench.sh: unknown option $1 (use --seconds N, --out DIR, --no-build)" >&2; exit 2 ;;
  esac
done
NGINX=/usr/sbin/nginx
for tool in wrk h2load "$KILN_VENV/bin/gunicorn" curl "$NGINX"; do
  command -v "$tool" >/dev/null || { echo "serving_bench.sh: $tool is not installed (bash scripts/setup.sh)" >&2; exit 2; }
done

BUILD_DIR=$(cd "${BUILD_DIR:-build}" && pwd)
[ $BUILD = 1 ] && cmake --build "$BUILD_DIR" --target kiln_cli serving_bench >/dev/null
KILN=${KILN:-$BUILD_DIR/kiln}
SB=$BUILD_DIR/bench/serving_bench
for f in "$KILN" "$SB"; do
  [ -x "$f" ] || { echo "serving_bench.sh: $f is missing (build with KILN_BENCH_AND_EXAMPLES=ON)" >&2; exit 2; }
done
"$KILN" show --system | head -n 3   # figures compare only within one run on one CPU
PY=$KILN_PYTHON   # .venv: the same torch (LibTorch 2.11) kiln builds against
CACHE=${MODEL_CACHE:-$PWD/build/serving_bench_models}   # trained once, reused by later runs
rm -rf "$OUT"
mkdir -p "$OUT/repo" "$OUT/logs" "$CACHE"
OUT=$(cd "$OUT" && pwd)
RESULTS=$OUT/results.txt
: >"$RESULTS"
CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(grep -o 'avx[^ ]*\|amx[^ ]*' /proc/cpuinfo | sort -u | xargs)"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
T_START=$(date +%s)
CONNECTIONS=${CONNECTIONS:-32}      # wrk connections and gRPC clients (closed loop)
MAX_BATCH=32
# The large model's clients: 2 x max_batch_size, so one full batch can fill
# while the previous one computes (with 32, the clients split into two
# halves that alternate: batches of ~16-18 rows). The small model keeps 32:
# there the cost is per request, and more connections than cores only add
# queueing.
LARGE_CONNECTIONS=${LARGE_CONNECTIONS:-$((2 * MAX_BATCH))}
C=$CONNECTIONS                      # the current model's
# The ceiling rows (issue 15 §4): one wrk command for nginx and kiln alike.
WRK_CEILING=(-t2 -c32)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

record() { echo "$1 $2 $3" >>"$RESULTS"; }   # model run json
# N free loopback ports, chosen here (held together so they differ) and
# passed to servers as numbers: a server's own meaning of 0 may change.
free_ports() {
  "$PY" -c "import socket,sys
s=[socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(('127.0.0.1', 0))
print(' '.join(str(x.getsockname()[1]) for x in s))" "$1"
}

# --- models -------------------------------------------------------------------
if [ ! -f "$CACHE/mnist/1/model.json" ]; then
  echo "== training the Fashion-MNIST MLP (2 epochs) into $CACHE/mnist"
  rm -rf "$CACHE/mnist"
  "$KILN" train examples/fashion_mnist_mlp.json --epochs 2 --output "$CACHE/mnist" | grep -E 'test_accuracy|Saved'
fi
if [ ! -f "$CACHE/large/1/model.json" ]; then
  echo "== building the larger MLP (784-2048-2048-2048-10, random weights) into $CACHE/large"
  rm -rf "$CACHE/large"
  "$SB" make_model --out "$CACHE/large/1" --hidden 2048,2048,2048 >/dev/null
fi
mnist_src=$(ls -d "$CACHE"/mnist/*/ | sort -V | tail -n 1)
for m in mnist large; do
  mkdir -p "$OUT/repo/$m"
  src=$([ $m = mnist ] && echo "$mnist_src" || echo "$CACHE/large/1")
  cp -r "$src" "$OUT/repo/$m/1"
done
"$SB" make_request --out "$OUT/body.json"
# The same image 32 times in one request (max_batch_size rows): what a client
# that batches on its side sends; compared with the bound in rows/s.
"$PY" -c "import json,sys; b=json.load(open(sys.argv[1])); json.dump({'instances': b['instances'] * $MAX_BATCH}, open(sys.argv[2], 'w'))" \
  "$OUT/body.json" "$OUT/body$MAX_BATCH.json"
cat >"$OUT/models.config" <<EOF
model_config_list {
  config { name: "mnist" base_path: "$OUT/repo/mnist" }
  config { name: "large" base_path: "$OUT/repo/large" }
}
EOF
# One batch thread: a kiln servable runs one call at a time (its intra-op
# threads use both cores), so a second batch thread only closes batches early
# and waits on the first (measured: mean batch 11 instead of ~30, 25% fewer QPS).
cat >"$OUT/batching.config" <<EOF
max_batch_size { value: $MAX_BATCH }
batch_timeout_micros { value: 2000 }
num_batch_threads { value: 1 }
max_enqueued_batches { value: 1000 }
EOF
input_name() { "$PY" -c "import json,sys; print(next(iter(json.load(open(sys.argv[1]))['signatures']['serving_default']['inputs'])))" "$1/model.json"; }

# --- nginx: the machine's HTTP ceiling ------------------------------------------
# `return 200` (no body) on 2 workers, keep-alive, no access log: the most
# requests/s an HTTP/1.1 server reaches here with this wrk. Measured at the
# start and at the end of the run; the report uses the mean.
ceiling_wrk() {  # ceiling_wrk URL [MODEL BODY] -> WRK_JSON (GET without MODEL)
  local url=$1; shift
  wrk "${WRK_CEILING[@]}" -d1s -s bench/serving_predict.lua "$url" -- "$@" >/dev/null  # warm-up
  wrk "${WRK_CEILING[@]}" -d${SECONDS_PER_RUN}s --timeout 10s -s bench/serving_predict.lua "$url" -- "$@" \
    | sed -n 's/^WRK_JSON //p'
}
measure_nginx() {  # measure_nginx RUN
  local dir=$OUT/nginx port pid
  port=$(free_ports 1)
  rm -rf "$dir"
  mkdir -p "$dir/logs"
  cat >"$dir/nginx.conf" <<EOF
daemon off;
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$port;
    location / { return 200; }
  }
}
EOF
  "$NGINX" -p "$dir" -c "$dir/nginx.conf" &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 100); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/" && break
    kill -0 "$pid" 2>/dev/null || { echo "nginx exited:" >&2; cat "$dir/logs/error.log" >&2; exit 1; }
    sleep 0.05
  done
  echo "== nginx return 200 ($1): the HTTP ceiling, wrk ${WRK_CEILING[*]}"
  record nginx "$1" "$(ceiling_wrk "http://127.0.0.1:$port/v2/health/live")"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
measure_nginx start

# --- kiln serve ------------------------------------------------------------------
REST_THREADS=${REST_THREADS:-auto}
if [ "$REST_THREADS" = auto ]; then
  REST_THREADS=per_connection
  help=$("$KILN" serve --help 2>&1 || true)
  grep -q 'I/O threads' <<<"$help" && REST_THREADS=default
fi
rest_threads() {  # the --rest_api_num_threads flag for C clients, if any
  case "$REST_THREADS" in
    default) ;;
    per_connection) echo "--rest_api_num_threads $((C + 16))" ;;
    *) echo "--rest_api_num_threads $REST_THREADS" ;;
  esac
}
REST=""; GRPC=""; SERVER_PID=""
start_kiln() {  # start_kiln LABEL [extra flags]
  local label=$1; shift
  local try ports
  for try in 1 2 3; do  # a chosen port can be taken between choosing and binding
    read -r -a ports <<<"$(free_ports 2)"
    REST=127.0.0.1:${ports[0]}
    GRPC=127.0.0.1:${ports[1]}
    "$KILN" serve --model_config_file "$OUT/models.config" --rest_api_port "${ports[0]}" --port "${ports[1]}" \
      $(rest_threads) --file_system_poll_wait_seconds 0.05 "$@" \
      >"$OUT/logs/$label.out" 2>"$OUT/logs/$label.err" &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    # Ready: both models AVAILABLE on REST, the gRPC port accepts connections.
    for _ in $(seq 1 600); do
      if curl -sf "http://$REST/v1/models/mnist" | grep -q AVAILABLE &&
        curl -sf "http://$REST/v1/models/large" | grep -q AVAILABLE &&
        (exec 3<>"/dev/tcp/127.0.0.1/${ports[1]}") 2>/dev/null; then
        return 0
      fi
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "kiln serve ($label) not ready in 60 s:" >&2; cat "$OUT/logs/$label.err" >&2; exit 1
    fi
    grep -qi 'in use' "$OUT/logs/$label.err" || break
  done
  echo "kiln serve ($label) exited:" >&2; cat "$OUT/logs/$label.err" >&2; exit 1
}
stop_server() { kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; }

run_wrk() {  # run_wrk HOST:PORT MODEL [BODY] -> the WRK_JSON object
  local body=${3:-$OUT/body.json}
  wrk -t1 -c$C -d1s -s bench/serving_predict.lua "http://$1" -- "$2" "$body" >/dev/null  # warm-up
  wrk -t1 -c$C -d${SECONDS_PER_RUN}s --timeout 10s -s bench/serving_predict.lua "http://$1" -- "$2" "$body" \
    | sed -n 's/^WRK_JSON //p'
}
# gRPC Predict from h2load (-t2, one stream per connection, closed loop);
# the server's kiln_requests_total decides what succeeded.
run_h2load() {  # run_h2load MODEL -> JSON
  "$PY" bench/serving_h2load.py --grpc "$GRPC" --rest "$REST" --model "$1" --body "$OUT/$1.grpc" \
    --clients "$C" --threads 2 --seconds "$SECONDS_PER_RUN"
}
# p50/p99 at half the peak (fixed rate): half of the closed-loop peak of the
# fixed-rate generator itself (it costs more CPU per request than wrk, and
# shares the 2 cores with the server: half of wrk's peak was ~73% of its
# own, near saturation). gRPC: half of `serving_bench load --grpc`'s peak.
half_peak() {  # half_peak MODEL INPUT PREFIX GRPC_PEAK_JSON
  local m=$1 in=$2 prefix=$3 grpc_peak=$4 rest_gen half
  rest_gen=$("$SB" load --rest "$REST" --model $m --body "$OUT/body.json" --concurrency $C --seconds "$SECONDS_PER_RUN")
  record $m "${prefix}rest_gen_peak" "$rest_gen"
  half=$("$PY" -c "print(round(0.5 * $(json_get "$rest_gen" qps), 1))")
  record $m "${prefix}rest_half" "$("$SB" load --rest "$REST" --model $m --body "$OUT/body.json" \
    --concurrency $C --seconds "$SECONDS_PER_RUN" --rate "$half")"
  half=$("$PY" -c "print(round(0.5 * $(json_get "$grpc_peak" qps), 1))")
  record $m "${prefix}grpc_half" "$("$SB" load --grpc "$GRPC" --model $m --input_name "$in" --body "$OUT/body.json" \
    --concurrency $C --seconds "$SECONDS_PER_RUN" --rate "$half")"
}
answer() { curl -s -X POST -H 'Content-Type: application/json' --data-binary @"$OUT/body.json" "http://$1/v1/models/$2:predict"; }
json_get() { "$PY" -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

for m in mnist large; do
  C=$([ $m = large ] && echo "$LARGE_CONNECTIONS" || echo "$CONNECTIONS")
  record $m clients "{\"connections\": $C, \"rest_api_num_threads\": \"$(rest_threads | cut -s -d' ' -f2)\"}"
  in=$(input_name "$OUT/repo/$m/1")
  echo "== $m: in-process bound"
  record $m bound_b1 "$("$SB" bound --model_dir "$OUT/repo/$m/1" --body "$OUT/body.json" --batch 1 --seconds 3)"
  record $m bound_b$MAX_BATCH "$("$SB" bound --model_dir "$OUT/repo/$m/1" --body "$OUT/body.json" --batch $MAX_BATCH --seconds 3)"
  for mode in plain batched; do
    flags=()
    [ $mode = batched ] && flags=(--enable_batching --batching_parameters_file "$OUT/batching.config")
    start_kiln "$m-$mode" "${flags[@]}"
    # The framed request for h2load, checked once through the gRPC client.
    [ -f "$OUT/$m.grpc" ] || "$SB" make_grpc_body --out "$OUT/$m.grpc" --model $m --input_name "$in" \
      --body "$OUT/body.json" --check "$GRPC" >/dev/null
    echo "== $m: kiln serve $mode, REST (wrk) and gRPC (serving_bench clients, then h2load)"
    rest=$(run_wrk "$REST" $m)
    record $m rest_$mode "$rest"
    grpc=$("$SB" load --grpc "$GRPC" --model $m --input_name "$in" --body "$OUT/body.json" \
      --concurrency $C --seconds "$SECONDS_PER_RUN")
    record $m grpc_$mode "$grpc"
    record $m grpc_h2load_$mode "$(run_h2load $m)"
    if [ $mode = plain ] && [ $m = mnist ]; then
      echo "== $m: p50/p99 at half the peak without batching (fixed rate)"
      half_peak $m "$in" plain_ "$grpc"
    fi
    if [ $mode = batched ]; then
      echo "== $m: REST, $MAX_BATCH rows per request; the HTTP ceiling (GET /v2/health/live, same wrk)"
      record $m rest_batched_rows$MAX_BATCH "$(run_wrk "$REST" $m "$OUT/body$MAX_BATCH.json")"
      if [ $m = mnist ]; then
        record $m rest_ceiling "$(wrk -t1 -c$C -d${SECONDS_PER_RUN}s -s bench/serving_predict.lua \
          "http://$REST/v2/health/live" | sed -n 's/^WRK_JSON //p')"
        echo "== $m: against nginx: kiln GET /v2/health/live and one-row predict, wrk ${WRK_CEILING[*]}"
        record $m ceil_health "$(ceiling_wrk "http://$REST/v2/health/live")"
        record $m ceil_rest_batched "$(ceiling_wrk "http://$REST" $m "$OUT/body.json")"
      fi
      echo "== $m: p50/p99 at half the peak QPS (fixed rate)"
      half_peak $m "$in" "" "$grpc"
    fi
    answer "$REST" $m >"$OUT/logs/$m-kiln-$mode.answer"
    curl -s "http://$REST/metrics" | grep -E '^kiln_batch_size_(sum|count)\{model="'$m'"' >"$OUT/logs/$m-$mode.batch" || true
    stop_server
  done

  echo "== $m: Flask + PyTorch under gunicorn (2 workers, 1 thread each)"
  port=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
  KILN_MODEL_DIR="$OUT/repo/$m/1" KILN_MODEL_NAME=$m OMP_WAIT_POLICY=PASSIVE \
    "$KILN_VENV/bin/gunicorn" -w 2 -b 127.0.0.1:$port --chdir bench --log-level warning \
    'serving_flask:create_app()' >"$OUT/logs/$m-flask.out" 2>&1 &
  FLASK_PID=$!
  PIDS+=("$FLASK_PID")
  for _ in $(seq 1 300); do
    curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' --data-binary @"$OUT/body.json" \
      "http://127.0.0.1:$port/v1/models/$m:predict" && break
    sleep 0.1
  done
  answer 127.0.0.1:$port $m >"$OUT/logs/$m-flask.answer"   # the report compares it with kiln's
  record $m flask "$(run_wrk 127.0.0.1:$port $m)"
  kill "$FLASK_PID"; wait "$FLASK_PID" 2>/dev/null || true
  # The bound again: on a shared machine it moves with the load; the report
  # uses the mean of the two and shows both.
  record $m bound_b${MAX_BATCH}_after "$("$SB" bound --model_dir "$OUT/repo/$m/1" --body "$OUT/body.json" --batch $MAX_BATCH --seconds 3)"
done

# --- version swaps under load, and reload isolation -------------------------------
C=$CONNECTIONS
start_kiln swaps --enable_batching --batching_parameters_file "$OUT/batching.config"
echo "== 50 version swaps of mnist under REST load (poll every 50 ms)"
record mnist swaps "$("$SB" swap --rest "$REST" --model mnist --body "$OUT/body.json" --base "$OUT/repo/mnist" \
  --source "$OUT/repo/mnist/1" --swaps 50 --concurrency 8)" || true
echo "== mnist latency at a fixed rate, alone and while 'large' reloads back to back"
record mnist isolation "$("$SB" isolation --rest "$REST" --model mnist --body "$OUT/body.json" --rate 500 \
  --concurrency 8 --seconds 6 --reload_model large --reload_base "$OUT/repo/large" \
  --reload_source "$OUT/repo/large/1")" || true
stop_server

measure_nginx end

# --- the table ------------------------------------------------------------------
"$PY" bench/serving_report.py "$RESULTS" "$OUT/logs" --cpu "$CPU" \
  --machine "$(nproc) cores, load $LOAD_START at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end, $(($(date +%s) - T_START)) s"
