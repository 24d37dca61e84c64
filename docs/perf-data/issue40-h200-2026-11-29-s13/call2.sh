#!/usr/bin/env bash
# Session 13, call 2: issue 40's done-when in one call on the committed build: host K = 1, 4, 8, 16
# against free, walking, buffer-filling and timed C; GPU staging at 16 sockets against its grid.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s13; mkdir -p $W/done
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS="host gpu" REPS=3 OUT=$W/done timeout 540 bash docs/perf-data/issue40-gpu.sh > $W/done/run.txt 2>&1; echo "== done rc=$? at $(el) s"
cat $W/done/summary.txt 2>/dev/null
tar -C $W -czf $R/s13b.tgz done
echo "== end at $(el) s"
