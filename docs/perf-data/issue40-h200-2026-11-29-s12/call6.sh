#!/usr/bin/env bash
# Session 12, call 6: worker threads per side at 16 and 8 sockets, with receives around the cache.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s12; mkdir -p $W/threads
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS=threads VK="16 8" THREADS="4 12 16" REPS=3 OUT=$W/threads timeout 300 bash docs/perf-data/issue40-gpu.sh > $W/threads/run.txt 2>&1; echo "== threads rc=$? at $(el) s"
cat $W/threads/summary.txt 2>/dev/null
tar -C $W -czf $R/s12f.tgz threads
echo "== end at $(el) s"
