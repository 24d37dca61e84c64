#!/usr/bin/env bash
# Session 14, call 3: issue 40's done-when on the build with `worker_cpus` (auto: a CPU of its own
# per socket worker on 16 or more CPUs of one NUMA node): host K = 1, 4, 8, 16 against free,
# walking, buffer-filling and timed C, and the same build with --worker-cpus shared (the
# kernel's placement, as before); GPU staging at 16 sockets likewise, 120 iterations.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s14; mkdir -p $W/c3
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc; ls /sys/devices/system/node/ 2>&1 | head
PARTS="host gpu" REPS=3 GPU_ONLY_AUTO=1 GPU_ITERS=120 \
  HOST_EXTRA="shared=--worker-cpus:shared" GPU_EXTRA="shared=--worker-cpus:shared" OUT=$W/c3 \
  timeout 560 bash docs/perf-data/issue40-gpu.sh > $W/c3/run.txt 2>&1; echo "== rc=$? at $(el) s"
cat $W/c3/summary.txt 2>/dev/null
grep -h worker_cpus $W/c3/issue40.jsonl | head -3 | cut -c1-400
tar -C $W -czf $R/s14c.tgz c3
echo "== end at $(el) s"
