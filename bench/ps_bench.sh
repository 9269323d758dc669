#!/usr/bin/env bash
# Parameter-server training (issue #14, §2): `kiln train` of one MLP spec
# (784-256-256-10, ReLU, SGD, Fashion-MNIST, batch 64 per worker step),
# every job started by `kiln launch` with 1 thread per task, one after the
# other in the same run:
#   async, 2 ps, 1..4 workers; async, 1 ps, 4 workers
#   sync (backup_workers 0), 2 ps, 1..4 workers; sync 3 workers, backup_workers 1
#   DataParallel on 1, 2, 4 ranks, global batch 64 x ranks (64 per rank)
#   async, 2 ps, 1 and 4 workers with a large MLP (784-2048-2048-10) whose
#   bytes per step dominate
# Per job: examples/s (parameter servers: the chief's worker steps x 64 / its
# training time; DataParallel: steps x global batch / the seconds from the
# chief's "Epoch 1/" line to its last epoch line, as they arrived), the bytes
# per worker step and through the ps tasks per second, the cores the job's
# tasks used while training (chief + workers / ps) and the machine's busy
# cores (other processes included), and the time to the first epoch whose
# training loss is under TARGET (from the chief's "Epoch 1/" line to that
# epoch's line, as they arrived); "start s": seconds from the launch to the
# chief's first training line (processes, data, connections). Exits non-zero, with the log's tail, if a
# job fails or gives no result.
# Usage: bench/ps_bench.sh [build dir]
#   env: LIMIT=20000 EPOCHS=8 TARGET=0.5 LR=0.1 HIDDEN=256,256
#        BIG_HIDDEN=2048,2048 BIG_LIMIT=4800 BIG_WORKERS="1 4" DP_RANKS="1 2 4"
#        WORKERS="1 2 3 4" JOB_TIMEOUT=240 KEEP=0 (KEEP=1: keep the logs; an empty
#        WORKERS, DP_RANKS or BIG_WORKERS skips those jobs)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/torch_env.sh
BUILD=${1:-build}
LIMIT=${LIMIT:-20000}
EPOCHS=${EPOCHS:-8}
TARGET=${TARGET:-0.5}
LR=${LR:-0.1}
HIDDEN=${HIDDEN:-256,256}
BIG_HIDDEN=${BIG_HIDDEN:-2048,2048}
BIG_LIMIT=${BIG_LIMIT:-4800}
BIG_WORKERS=${BIG_WORKERS-1 4}
DP_RANKS=${DP_RANKS-1 2 4}
WORKERS=${WORKERS-1 2 3 4}
JOB_TIMEOUT=${JOB_TIMEOUT:-240}
KEEP=${KEEP:-0}
PY=$KILN_PYTHON   # .venv: the same torch (LibTorch 2.11) kiln builds against
REPORT=$(realpath bench/ps_report.py)
TMP=$(mktemp -d /tmp/ps_bench.XXXXXX)
job_pid=""
stamp_pid=""
cleanup() {
  # the running job: `timeout` passes the TERM to `kiln launch`, which
  # stops its tasks (they also die with it: PR_SET_PDEATHSIG)
  for p in $job_pid $stamp_pid; do kill "$p" 2>/dev/null || true; done
  [ -n "$job_pid" ] && wait "$job_pid" 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then echo "logs: $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# A copy of kiln and its libraries, so that a rebuild of the build directory
# during the run changes no job (kiln's RUNPATH gives way to LD_LIBRARY_PATH).
mkdir "$TMP/bin"
cp "$BUILD/kiln" "$BUILD"/lib*.so "$TMP/bin/"
KILN="$TMP/bin/kiln"
export LD_LIBRARY_PATH="$TMP/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

"$KILN" show --system | head -n 3
nproc | sed 's/^/cores: /'
uptime | sed 's/.*load/load/'
echo "data: Fashion-MNIST, first $LIMIT training images ($BIG_LIMIT for the large model), $EPOCHS epochs, SGD lr $LR, batch 64 per worker step, loss target $TARGET"

# run NAME BATCH HIDDEN LIMIT EPOCHS DIST BACKUP -- LAUNCH ARGS...
run() {
  local name=$1 batch=$2 hidden=$3 limit=$4 epochs=$5 dist=$6 backup=$7
  shift 8
  local id=${name//[^a-zA-Z0-9]/_}
  local spec="$TMP/$id.json" log="$TMP/$id.log"
  $PY "$REPORT" spec "$spec" --hidden "$hidden" --limit "$limit" --epochs "$epochs" --lr "$LR" \
    --batch "$batch" --dist "$dist" --backup "$backup" --base "$TMP/out"
  rm -f "$TMP/fifo" && mkfifo "$TMP/fifo"
  $PY "$REPORT" stamp "$spec" <"$TMP/fifo" >"$log" &
  stamp_pid=$!
  local t0=$SECONDS rc=0
  timeout -k 15 "$JOB_TIMEOUT" "$KILN" launch --threads_per_rank 1 "$@" -- "$KILN" train "$spec" >"$TMP/fifo" 2>&1 &
  job_pid=$!
  wait "$job_pid" || rc=$?
  job_pid=""
  wait "$stamp_pid" || true
  stamp_pid=""
  local r
  r=$($PY "$REPORT" result "$name" "$log" "$batch" "$TARGET")
  echo "$r" >>"$TMP/results.txt"
  if [ "$rc" != 0 ] || ! echo "$r" | grep -q '"ok": true'; then
    echo "FAILED: $name (exit $rc$([ "$rc" = 124 ] && echo ": timed out after ${JOB_TIMEOUT} s"))"
    tail -n 30 "$log" | sed 's/^/  | /'
    failed+=("$name")
  fi
  local s
  s=$(grep -E '^[0-9.]+ \[chief0\] Parameter servers: (async|sync),' "$log" | cut -d' ' -f2- || true)
  echo "$name: $((SECONDS - t0)) s in all${s:+; $s}"
}
failed=()

for w in $WORKERS; do
  run "async ${w}w 2ps" 64 "$HIDDEN" "$LIMIT" "$EPOCHS" async 0 -- --num_ps 2 --num_workers "$w"
done
run "async 4w 1ps" 64 "$HIDDEN" "$LIMIT" "$EPOCHS" async 0 -- --num_ps 1 --num_workers 4
for w in $WORKERS; do
  run "sync ${w}w 2ps" 64 "$HIDDEN" "$LIMIT" "$EPOCHS" sync 0 -- --num_ps 2 --num_workers "$w"
done
run "sync 3w 2ps backup 1" 64 "$HIDDEN" "$LIMIT" "$EPOCHS" sync 1 -- --num_ps 2 --num_workers 3
for n in $DP_RANKS; do
  run "dataparallel ${n} ranks" $((64 * n)) "$HIDDEN" "$LIMIT" "$EPOCHS" data_parallel 0 -- \
    --nproc_per_node "$n" --master_port $((29600 + RANDOM % 300))
done
for w in $BIG_WORKERS; do
  run "async ${w}w 2ps big" 64 "$BIG_HIDDEN" "$BIG_LIMIT" 1 async 0 -- --num_ps 2 --num_workers "$w"
done

echo
echo "MLP 784-${HIDDEN//,/-}-10 (big: 784-${BIG_HIDDEN//,/-}-10), batch 64 per worker step; 'vs 1': examples/s against"
echo "the group's first row; KiB/step: pulled + pushed per worker step; ps MB/s: that x worker steps/s (10^6 B); cores:"
echo "CPU seconds the job's tasks used per second of training (chief + workers or ranks / ps tasks); machine:"
echo "busy cores of the whole machine then; loss<$TARGET: seconds of training to the first such epoch (its number)"
$PY "$REPORT" table "$TMP/results.txt" "$TARGET"
if [ ${#failed[@]} -ne 0 ]; then
  echo "failed: ${failed[*]}"
  exit 1
fi
