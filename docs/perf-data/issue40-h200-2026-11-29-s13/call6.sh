#!/usr/bin/env bash
# Session 13, call 6: cpu-clock profiles per thread and symbol of C and the tool at 16 sockets.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s13; mkdir -p $W/prof
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS="perf" OUT=$W/prof timeout 300 bash docs/perf-data/issue40-gpu.sh > $W/prof/run.txt 2>&1; echo "== prof rc=$? at $(( $(date +%s) - T0 )) s"
ls -la $W/prof
tar -C $W -czf $R/s13f.tgz prof
