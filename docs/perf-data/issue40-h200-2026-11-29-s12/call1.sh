#!/usr/bin/env bash
# Session 12, call 1: receive-bounce candidates (C and tool) at K=16 and 8, perf profiles, GPU staging.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s12; mkdir -p $W/var $W/perf $W/gpu
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS=variants VK="16 8" REPS=3 OUT=$W/var timeout 260 bash docs/perf-data/issue40-gpu.sh > $W/var/run.txt 2>&1; echo "== variants rc=$? at $(el) s"
cat $W/var/summary.txt 2>/dev/null
PARTS=perf OUT=$W/perf timeout 110 bash docs/perf-data/issue40-gpu.sh > $W/perf/run.txt 2>&1; echo "== perf rc=$? at $(el) s"
grep -A10 -- "-- perf" $W/perf/run.txt | head -80; tail -5 $W/perf/run.txt
left=$(( 570 - $(el) ))
[ $left -gt 40 ] && { PARTS=gpu REPS=2 OUT=$W/gpu timeout $(( left - 5 )) bash docs/perf-data/issue40-gpu.sh > $W/gpu/run.txt 2>&1; echo "== gpu rc=$? at $(el) s"; cat $W/gpu/summary.txt 2>/dev/null; }
tar -C $W -czf $R/s12a.tgz var perf gpu
echo "== end at $(el) s"
