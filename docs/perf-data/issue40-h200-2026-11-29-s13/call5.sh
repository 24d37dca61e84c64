#!/usr/bin/env bash
# Session 13, call 5: issue 40's done-when again, GPU runs of 120 iterations in one call on the committed build: host K = 1, 4, 8, 16
# against free, walking, buffer-filling and timed C; GPU staging at 16 sockets against its grid.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s13; mkdir -p $W/final
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS="host gpu" GPU_ITERS=120 REPS=3 OUT=$W/final timeout 540 bash docs/perf-data/issue40-gpu.sh > $W/final/run.txt 2>&1; echo "== final rc=$? at $(el) s"
cat $W/final/summary.txt 2>/dev/null
tar -C $W -czf $R/s13e.tgz final
echo "== end at $(el) s"
