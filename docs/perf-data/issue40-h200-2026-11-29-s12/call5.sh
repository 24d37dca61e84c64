#!/usr/bin/env bash
# Session 12, call 5: the committed rule (receives around the cache from a quarter of the
# last-level cache) against the previous build: host K=1..16 at 256 MiB with free and walking C;
# GPU staging (no flags) against the previous build.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s12; mkdir -p $W/host $W/gpu
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS=host REPS=3 OUT=$W/host timeout 230 bash docs/perf-data/issue40-gpu.sh > $W/host/run.txt 2>&1; echo "== host rc=$? at $(el) s"
grep cache $W/host/machine.txt; cat $W/host/summary.txt 2>/dev/null
PARTS=gpu GPU_ONLY_AUTO=1 REPS=3 OUT=$W/gpu timeout 90 bash docs/perf-data/issue40-gpu.sh > $W/gpu/run.txt 2>&1; echo "== gpu rc=$? at $(el) s"
cat $W/gpu/summary.txt 2>/dev/null
tar -C $W -czf $R/s12e.tgz host gpu
echo "== end at $(el) s"
