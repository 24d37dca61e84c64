#!/usr/bin/env bash
# Session 13, call 7: host memory at 1, 2 and 4 sockets, 256 and 64 MiB: the auto rule against
# 512K x 16, 1M x 16 and 4M x 32, with free-running C, 3 interleaved repetitions.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s13; mkdir -p $W/narrow
echo "== start $(date -u)"; nvidia-smi -L; nproc
for mib in 256 64; do
  PARTS="host" KS="1 2 4" MIB=$mib HOST_FREE_ONLY=1 REPS=3 OUT=$W/narrow/m$mib \
    HOST_EXTRA="c512k_w16=--chunk:512K,--window:16 c1m_w16=--chunk:1M,--window:16 c4m_w32=--chunk:4M,--window:32" \
    timeout 260 bash docs/perf-data/issue40-gpu.sh > $W/narrow/run-$mib.txt 2>&1; echo "== $mib rc=$? at $(( $(date +%s) - T0 )) s"
  cat $W/narrow/m$mib/summary.txt
done
tar -C $W -czf $R/s13g.tgz narrow
