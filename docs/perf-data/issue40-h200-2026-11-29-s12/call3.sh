#!/usr/bin/env bash
# Session 12, call 3: receives around the cache above twice the last-level cache, against the
# previous build: host K=1..16 at 256 MiB with free and walking C; 64 and 128 MiB; GPU staging.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s12; mkdir -p $W/host $W/sizes $W/gpu
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS=host REPS=3 OUT=$W/host timeout 220 bash docs/perf-data/issue40-gpu.sh > $W/host/run.txt 2>&1; echo "== host rc=$? at $(el) s"
grep cache $W/host/machine.txt; cat $W/host/summary.txt 2>/dev/null
PARTS=sizes SIZES_KS="1 4 8 16" SIZES_MIB="64 128" REPS=2 OUT=$W/sizes timeout 150 bash docs/perf-data/issue40-gpu.sh > $W/sizes/run.txt 2>&1; echo "== sizes rc=$? at $(el) s"
cat $W/sizes/summary.txt 2>/dev/null
left=$(( 540 - $(el) ))
[ $left -gt 40 ] && { PARTS=gpu GPU_ONLY_AUTO=1 REPS=2 OUT=$W/gpu timeout $(( left > 80 ? 80 : left - 5 )) bash docs/perf-data/issue40-gpu.sh > $W/gpu/run.txt 2>&1; echo "== gpu rc=$? at $(el) s"; cat $W/gpu/summary.txt 2>/dev/null; }
tar -C $W -czf $R/s12c.tgz host sizes gpu
echo "== end at $(el) s"
