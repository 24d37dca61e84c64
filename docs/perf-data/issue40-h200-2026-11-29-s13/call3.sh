#!/usr/bin/env bash
# Session 13, call 3: GPU staging at 16 sockets: ring x chunk variants with longer runs, and
# cpu-clock profiles (per symbol and per thread) of C, the host path and GPU staging.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s13; mkdir -p $W/gpu
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS="gpu perf" PERF_GPU=1 GPU_ONLY_AUTO=1 GPU_ITERS=120 REPS=3 OUT=$W/gpu \
  GPU_EXTRA="c16M_w32=--chunk:16M,--window:32 c8M_r64m=--chunk:8M,--staging-ring:64M c16M_r96m=--chunk:16M,--staging-ring:96M c16M_r48m=--chunk:16M,--staging-ring:48M c32M_r128m=--chunk:32M,--staging-ring:128M" \
  timeout 500 bash docs/perf-data/issue40-gpu.sh > $W/gpu/run.txt 2>&1; echo "== gpu rc=$? at $(el) s"
cat $W/gpu/summary.txt 2>/dev/null
for f in $W/gpu/perf-*.txt; do echo "-- $f"; head -n 14 $f; done
tar -C $W -czf $R/s13c.tgz gpu
echo "== end at $(el) s"
