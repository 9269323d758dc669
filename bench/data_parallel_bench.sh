#!/usr/bin/env bash
# Data-parallel throughput: kiln against PyTorch DDP (Debian python3-torch,
# gloo) on the same model, global batch, ranks and threads per rank, in the
# same run, both started by `kiln launch`. Prints each line and the ratios:
#   step_ratio_2ranks = kiln ms/step / DDP ms/step at 2 ranks (goal <= 0.9)
#   kiln_scaling      = kiln samples/s at 2 ranks x 1 thread / 1 rank x 1 thread (goal >= 1.7)
#   ddp_scaling       = the same for DDP
# Usage: bench/data_parallel_bench.sh [build dir] [--steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
STEPS=${STEPS:-20}
KILN="$BUILD/kiln"
BENCH="$BUILD/bench/data_parallel_bench"
PY=/usr/bin/python3
grep -o -w -E 'avx2|avx512f|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/^/cpu flags: /'; echo
nproc | sed 's/^/cores: /'
run() { "$KILN" launch --nproc_per_node "$1" --threads_per_rank 1 --master_port $((29600 + RANDOM % 300)) -- "${@:2}" 2>&1 |
  sed -n 's/^\[rank0\] //p' | grep -E '^(data_parallel|ddp) '; }
k1=$(run 1 "$BENCH" --steps "$STEPS"); echo "$k1"
k2=$(run 2 "$BENCH" --steps "$STEPS"); echo "$k2"
d1=$(run 1 "$PY" bench/ddp_peer.py --steps "$STEPS"); echo "$d1"
d2=$(run 2 "$PY" bench/ddp_peer.py --steps "$STEPS"); echo "$d2"
field() { sed -n "s/.*$2=\([0-9.]*\).*/\1/p" <<<"$1"; }
$PY - "$(field "$k1" samples_per_s)" "$(field "$k2" samples_per_s)" "$(field "$d1" samples_per_s)" \
  "$(field "$d2" samples_per_s)" "$(field "$k2" ms_per_step)" "$(field "$d2" ms_per_step)" <<'PYEOF'
import sys
k1, k2, d1, d2, km, dm = map(float, sys.argv[1:])
print("step_ratio_2ranks (kiln/DDP ms per step, goal <= 0.9): %.2f" % (km / dm))
print("kiln_scaling (2x1 / 1x1 samples/s, goal >= 1.7): %.2f" % (k2 / k1))
print("ddp_scaling (2x1 / 1x1 samples/s): %.2f" % (d2 / d1))
PYEOF
