#!/usr/bin/env bash
# Session 12, call 4: receives around the cache forced on from 32 MiB (a build with
# TCPX_EXPERIMENT_AROUND_CACHE_MIN) against the previous build, at 256 and 128 MiB, K=1..16,
# with free and walking C.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s12; mkdir -p $W/h256 $W/h128
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
export TCPX_EXPERIMENT_AROUND_CACHE_MIN=33554432
PARTS=host REPS=3 OUT=$W/h256 timeout 230 bash docs/perf-data/issue40-gpu.sh > $W/h256/run.txt 2>&1; echo "== h256 rc=$? at $(el) s"
grep cache $W/h256/machine.txt; cat $W/h256/summary.txt 2>/dev/null
MIB=128 PARTS=host REPS=3 OUT=$W/h128 timeout 230 bash docs/perf-data/issue40-gpu.sh > $W/h128/run.txt 2>&1; echo "== h128 rc=$? at $(el) s"
cat $W/h128/summary.txt 2>/dev/null
tar -C $W -czf $R/s12d.tgz h256 h128
echo "== end at $(el) s"
