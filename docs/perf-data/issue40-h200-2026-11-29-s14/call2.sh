#!/usr/bin/env bash
# Session 14, call 2: each socket worker thread pinned to a CPU of its own
# (TCPX_EXPERIMENT_PIN=own) against the unpinned default at K = 1, 4, 8, 16 host sockets and
# GPU staging at 16, 3 interleaved repetitions, on another host than call 1. Build: as call 1.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s14; mkdir -p $W/c2
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS="envs gpu" VK="1 4 8 16" REPS=3 GPU_ONLY_AUTO=1 GPU_ITERS=120 \
  TOOL_ENVS="pinown=TCPX_EXPERIMENT_PIN:own" \
  GPU_EXTRA="pinown=TCPX_EXPERIMENT_PIN:own" OUT=$W/c2 \
  timeout 560 bash docs/perf-data/issue40-gpu.sh > $W/c2/run.txt 2>&1; echo "== rc=$? at $(el) s"
cat $W/c2/summary.txt 2>/dev/null
tar -C $W -czf $R/s14b.tgz c2
echo "== end at $(el) s"
