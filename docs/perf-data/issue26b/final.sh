#!/usr/bin/env bash
# Where the 16-socket gap goes: CPU per byte of the free-running yardstick (getrusage over its
# timed part) against the tool's (--sample-ms: process CPU over the timed iterations), with
# socket buffer sizes, call sizes and a misaligning prefix varied; interleaved repetitions.
NAME=final
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
for rep in $(seq 1 "$REPS"); do
  for k in ${KS:-1 2 4 8 16}; do
    yard c_free "$k"
    tool w8 "$k" 8
    tool w32 "$k" 32
    if [ "$k" -ge 8 ]; then
      TCPX_SOCKET_THREADS=$k TCPX_SOCKET_BLOCKING=1 tool blocking_w8 "$k" 8
      TCPX_SOCKET_THREADS=$k TCPX_SOCKET_BLOCKING=1 tool blocking_w32 "$k" 32
      TCPX_SOCKET_THREADS=$k tool t1ps_w32 "$k" 32
    fi
    if [ "$k" = 16 ]; then
      GPU=1 VERIFY=on CHUNK=8M tool gpu_w8 16 8
      GPU=1 VERIFY=on CHUNK=8M tool gpu_w32 16 32
      TCPX_SOCKET_THREADS=16 TCPX_SOCKET_BLOCKING=1 GPU=1 VERIFY=on CHUNK=8M tool gpu_blocking_w32 16 32
    fi
  done
  echo "rep $rep $(date -u +%T) $(cat /proc/loadavg)" >> "$L"
done
python3 "$B/table.py" "$J" w8 w32 blocking_w32 | tee "$O/final.md"
