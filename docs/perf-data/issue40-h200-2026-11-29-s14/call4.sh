#!/usr/bin/env bash
# Session 14, call 4: issue 40's done-when in one call on the committed build (worker_cpus auto:
# a CPU each when a comm's workers are at least half of 16+ CPUs of one NUMA node): host K = 1,
# 4, 8, 16 against free, walking, buffer-filling and timed C; GPU staging at 16 sockets with no
# flags against its grid (chunks 4M/8M/16M x windows 16/32, rings 32M/128M), 120 iterations.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s14; mkdir -p $W/c4
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS="host gpu" REPS=3 GPU_ITERS=120 OUT=$W/c4 \
  timeout 570 bash docs/perf-data/issue40-gpu.sh > $W/c4/run.txt 2>&1; echo "== rc=$? at $(el) s"
cat $W/c4/summary.txt 2>/dev/null
tar -C $W -czf $R/s14d.tgz c4
echo "== end at $(el) s"
