#!/usr/bin/env bash
# Session 12, call 7: per-iteration barrier against back to back at 16 and 8 sockets.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s12; mkdir -p $W/barrier
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS=barrier VK="16 8" REPS=3 OUT=$W/barrier timeout 150 bash docs/perf-data/issue40-gpu.sh > $W/barrier/run.txt 2>&1; echo "== barrier rc=$? at $(el) s"
cat $W/barrier/summary.txt 2>/dev/null
tar -C $W -czf $R/s12g.tgz barrier
echo "== end at $(el) s"
