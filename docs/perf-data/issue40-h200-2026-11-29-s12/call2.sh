#!/usr/bin/env bash
# Session 12, call 2: the receive-around-cache build against the previous one: host K=1..16 with
# free and walking C, sizes around the threshold, GPU staging with ring sizes; perf of both.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s12; mkdir -p $W/host $W/sizes $W/gpu $W/perf
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS=host REPS=3 OUT=$W/host timeout 250 bash docs/perf-data/issue40-gpu.sh > $W/host/run.txt 2>&1; echo "== host rc=$? at $(el) s"
cat $W/host/summary.txt 2>/dev/null
PARTS=gpu REPS=2 OUT=$W/gpu timeout 130 bash docs/perf-data/issue40-gpu.sh > $W/gpu/run.txt 2>&1; echo "== gpu rc=$? at $(el) s"
cat $W/gpu/summary.txt 2>/dev/null
left=$(( 560 - $(el) ))
[ $left -gt 40 ] && { PARTS=sizes REPS=2 OUT=$W/sizes timeout $(( left > 100 ? 100 : left - 5 )) bash docs/perf-data/issue40-gpu.sh > $W/sizes/run.txt 2>&1; echo "== sizes rc=$? at $(el) s"; cat $W/sizes/summary.txt 2>/dev/null; }
tar -C $W -czf $R/s12b.tgz host sizes gpu
echo "== end at $(el) s"
