#!/usr/bin/env bash
# Session 13, call 1: experiment switches (AVX2 streaming copy, asymmetric worker threads, bounce
# size) against free, walking-bounce and timed-bounce C at 16 and 8 sockets.
set -u
T0=$(date +%s); R=$OUT; W=/tmp/s13; mkdir -p $W/envs
el() { echo $(( $(date +%s) - T0 )); }
echo "== start $(date -u)"; nvidia-smi -L; nproc
PARTS=envs VK="16 8" REPS=3 OUT=$W/envs TOOL_ENVS="avx2=TCPX_EXPERIMENT_AVX2:1 r10s6=TCPX_EXPERIMENT_RECV_THREADS:10,TCPX_EXPERIMENT_SEND_THREADS:6 r12s8=TCPX_EXPERIMENT_RECV_THREADS:12,TCPX_EXPERIMENT_SEND_THREADS:8 r6s10=TCPX_EXPERIMENT_RECV_THREADS:6,TCPX_EXPERIMENT_SEND_THREADS:10 b256k=TCPX_EXPERIMENT_BOUNCE:262144 b64k=TCPX_EXPERIMENT_BOUNCE:65536" timeout 500 bash docs/perf-data/issue40-gpu.sh > $W/envs/run.txt 2>&1; echo "== envs rc=$? at $(el) s"
cat $W/envs/summary.txt 2>/dev/null
tar -C $W -czf $R/s13a.tgz envs
echo "== end at $(el) s"
