#!/usr/bin/env bash
# Session 13, call 4: GPU staging at 16 sockets: chunk 4M/8M/16M x staging ring 48M/64M/96M,
# window 32, 120 timed iterations, 5 interleaved repetitions with free-running C.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s13; mkdir -p $W/ring
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
X=""
for c in 4M 8M 16M; do for r in 48M 64M 96M; do X="$X c${c}_r${r}=--chunk:$c,--window:32,--staging-ring:$r"; done; done
PARTS="gpu" GPU_ONLY_AUTO=1 GPU_ITERS=120 REPS=5 OUT=$W/ring GPU_EXTRA="$X" \
  timeout 520 bash docs/perf-data/issue40-gpu.sh > $W/ring/run.txt 2>&1; echo "== ring rc=$? at $(el) s"
cat $W/ring/summary.txt 2>/dev/null
tar -C $W -czf $R/s13d.tgz ring
echo "== end at $(el) s"
