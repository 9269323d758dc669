#!/usr/bin/env bash
# Sharded optimizer state (ZeRO): the data-parallel benchmark's MLP with Adam
# on 2 ranks (1 thread each, both on this host) at zero_stage 0, 1 and 2, in
# the same run. The stages alternate for ROUNDS rounds (default 3) and each
# one's fastest round counts (other processes on a shared machine only ever
# add time). Prints every line, then per stage: ms per step and its ratio to
# stage 0, each rank's optimizer-state bytes during fit(), its resident
# memory after the last step and its peak resident memory.
# The ranks are started directly (torchrun's variables), so only the
# benchmark binary is needed.
# Usage: bench/zero_bench.sh [build dir]    (env: STEPS=20 ROUNDS=3 WIDTH=1024 KILN_SHM_ALLREDUCE)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${STEPS:-20}
ROUNDS=${ROUNDS:-3}
WIDTH=${WIDTH:-1024}
BENCH="$BUILD/bench/data_parallel_bench"
nproc | sed 's/^/cores: /'
run() {  # run STAGE: 2 ranks; the chief's result line
  local port=$((29600 + RANDOM % 300)) out
  out=$(mktemp -d)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port KILN_NUM_THREADS=1 \
      "$BENCH" --steps "$STEPS" --width "$WIDTH" --optimizer adam --zero_stage "$1" >"$out/$r" 2>&1 &
  done
  wait
  grep -h '^data_parallel ' "$out/0"
  rm -rf "$out"
}
lines=""
for round in $(seq "$ROUNDS"); do
  for stage in 0 1 2; do
    l=$(run $stage)
    echo "round $round stage $stage: $l"
    lines+="$l"$'\n'
  done
done
python3 - <<PYEOF
import re
best, mem = {}, {}
for line in """$lines""".splitlines():
    m = re.search(r"ms_per_step=([0-9.]+).*zero_stage=(\d) opt_state_bytes=(\S+) rss_MiB_in_fit=(\S+) peak_rss_MiB=(\S+)", line)
    if not m:
        continue
    ms, stage = float(m.group(1)), int(m.group(2))
    best[stage] = min(best.get(stage, 1e30), ms)
    # memory: the lowest seen per rank (other processes never lower it)
    cur = [tuple(int(v) for v in m.group(g).split(",")) for g in (3, 4, 5)]
    old = mem.get(stage, cur)
    mem[stage] = [tuple(min(a, b) for a, b in zip(x, y)) for x, y in zip(old, cur)]
print("best of $ROUNDS rounds, 2 ranks x 1 thread, Adam, width $WIDTH:")
for s in sorted(best):
    states, rss, peak = mem[s]
    print("zero_stage %d: %.1f ms/step (%.2f x stage 0); optimizer state per rank %s MB (%.2f of stage 0's); "
          "resident after the last step %s MiB; peak resident %s MiB"
          % (s, best[s], best[s] / best[0], ",".join("%.1f" % (v / 1e6) for v in states),
             max(states) / max(mem[0][0]), ",".join(map(str, rss)), ",".join(map(str, peak))))
PYEOF
