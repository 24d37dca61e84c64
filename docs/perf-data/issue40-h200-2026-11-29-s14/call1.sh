#!/usr/bin/env bash
# Session 14, call 1: worker threads pinned (TCPX_EXPERIMENT_PIN=own: each worker its own CPU;
# sets: senders on the first half of the CPUs, receivers on the second) against the unpinned
# default, at 16 and 8 sockets, 5 interleaved repetitions, with free, buffer-filling and timed C;
# GPU staging at 16 sockets, no flags and pinned, 120 iterations. Build: the working tree with
# call1-experiment-pin.patch.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s14; mkdir -p $W/c1
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS="envs gpu" VK="16 8" REPS=5 GPU_ONLY_AUTO=1 GPU_ITERS=120 \
  TOOL_ENVS="pinown=TCPX_EXPERIMENT_PIN:own pinsets=TCPX_EXPERIMENT_PIN:sets" \
  GPU_EXTRA="pinown=TCPX_EXPERIMENT_PIN:own" OUT=$W/c1 \
  timeout 560 bash docs/perf-data/issue40-gpu.sh > $W/c1/run.txt 2>&1; echo "== rc=$? at $(el) s"
cat $W/c1/summary.txt 2>/dev/null
tar -C $W -czf $R/s14a.tgz c1
echo "== end at $(el) s"
