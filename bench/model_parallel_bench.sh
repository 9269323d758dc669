#!/usr/bin/env bash
# Model parallelism under a per-process memory cap (docs/PERFORMANCE.md).
#   1. The unsharded model in one process, in a memory cgroup of its own
#      without a limit: the peak memory the cgroup charged it (P: what it
#      allocated after start-up, not the shared libraries).
#   2. The cap: CAP_FRACTION (default 0.8) x P per process, the limit of each
#      process's own memory cgroup (the kernel kills a process past it).
#   3. The unsharded model in one process under the cap: expected killed.
#   4. ModelParallel on 2 ranks (1 thread each), each under the same cap:
#      trains; weight and optimizer bytes per rank against the unsharded.
#   5. DataParallel on 2 ranks, uncapped (the model fits without a cap):
#      step time against ModelParallel's, alternating ROUNDS rounds (default
#      3), the fastest round of each counting.
# Needs root and a cgroup v1 memory hierarchy (the bench says so otherwise).
# Usage: bench/model_parallel_bench.sh [build dir]    (env: WIDTH=1024 DEPTH=2 STEPS=12 ROUNDS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
WIDTH=${WIDTH:-1024}
DEPTH=${DEPTH:-2}
STEPS=${STEPS:-12}
ROUNDS=${ROUNDS:-3}
CAP_FRACTION=${CAP_FRACTION:-0.8}
KILN="$BUILD/kiln"
BENCH="$BUILD/bench/model_parallel_bench"
ARGS=(--width "$WIDTH" --depth "$DEPTH" --steps "$STEPS")
# A process the cap killed leaves its (empty) cgroup behind: remove those.
cleanup() { find /sys/fs/cgroup/memory -maxdepth 4 -type d -name 'kiln-bench-*' -exec rmdir {} + 2>/dev/null || true; }
trap cleanup EXIT
"$KILN" show --system | head -n 3
nproc | sed 's/^/cores: /'
launch() { # ranks, then bench args; prints every rank's result line
  "$KILN" launch --nproc_per_node "$1" --threads_per_rank 1 --master_port $((29600 + RANDOM % 300)) -- \
    "$BENCH" "${@:2}" 2>&1 | sed -n 's/^\[rank[0-9]*\] //p' | grep -E '^(model_parallel|data_parallel) ' || true
}
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -n 1; }

set +e
single=$(KILN_NUM_THREADS=1 "$BENCH" --mode single "${ARGS[@]}" --mem_cap_mb -1 2>&1)
[ $? = 3 ] && { echo "$single"; exit 3; }
set -e
single=$(echo "$single" | grep '^single ')
echo "uncapped: $single"
peak=$(echo "$single" | field charged_peak_mb)
cap=$(awk -v p="$peak" -v f="$CAP_FRACTION" 'BEGIN { printf "%d", p * f }')
echo "cap per process: ${cap} MB (${CAP_FRACTION} x the unsharded model's charged peak ${peak} MB)"

set +e
capped=$(KILN_NUM_THREADS=1 "$BENCH" --mode single "${ARGS[@]}" --mem_cap_mb "$cap" 2>&1)
code=$?
set -e
echo "unsharded under the cap: exit $code $(echo "$capped" | grep '^single ' || echo '(no result: killed)')"

mp_best=0 dp_best=0 mp_lines=""
for round in $(seq "$ROUNDS"); do
  mp=$(launch 2 --mode model_parallel "${ARGS[@]}" --mem_cap_mb "$cap")
  dp=$(launch 2 --mode data_parallel "${ARGS[@]}")
  echo "round $round:"
  echo "$mp" | sed 's/^/  /'
  echo "$dp" | sed 's/^/  /'
  [ "$round" = 1 ] && mp_lines=$mp
  m=$(echo "$mp" | grep 'rank=0' | field ms_per_step)
  d=$(echo "$dp" | grep 'rank=0' | field ms_per_step)
  mp_best=$(awk -v a="$mp_best" -v b="${m:-0}" 'BEGIN { print (a == 0 || (b > 0 && b < a)) ? b : a }')
  dp_best=$(awk -v a="$dp_best" -v b="${d:-0}" 'BEGIN { print (a == 0 || (b > 0 && b < a)) ? b : a }')
done
w1=$(echo "$single" | field weight_bytes)
o1=$(echo "$single" | field optimizer_bytes)
w2=$(echo "$mp_lines" | grep 'rank=0' | field weight_bytes)
o2=$(echo "$mp_lines" | grep 'rank=0' | field optimizer_bytes)
r2=$(echo "$mp_lines" | grep 'rank=0' | field charged_peak_mb)
awk -v w1="$w1" -v o1="$o1" -v w2="$w2" -v o2="$o2" -v p1="$peak" -v p2="$r2" -v cap="$cap" -v code="$code" \
  -v mp="$mp_best" -v dp="$dp_best" 'BEGIN {
  printf "unsharded_under_cap_exit = %d (137: killed by the cap)\n", code
  printf "weight_bytes_per_rank    = %.3f of the unsharded model\n", w2 / w1
  printf "optimizer_bytes_per_rank = %.3f of the unsharded model\n", o2 / o1
  printf "charged_peak_per_rank_mb = %.0f (cap %d; unsharded %.0f)\n", p2, cap, p1
  printf "step_ms model_parallel   = %.1f, data_parallel = %.1f (ratio %.2f)\n", mp, dp, (dp > 0 ? mp / dp : 0)
}'
