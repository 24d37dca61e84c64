#!/usr/bin/env bash
# Where the 16-socket gap goes: CPU per byte of the free-running yardstick (getrusage over its
# timed part) against the tool's (--sample-ms: process CPU over the timed iterations), with
# socket buffer sizes, call sizes and a misaligning prefix varied; interleaved repetitions.
NAME=profile
. "$(cd "$(dirname "$0")" && pwd)/common.sh"
for rep in $(seq 1 "$REPS"); do
  for k in 8 16; do
    yard c_free "$k"
    yard c_free_buf1M "$k" TCP_YARDSTICK_BUF=1048576
    yard c_free_skew52 "$k" TCP_YARDSTICK_SKEW=52
    CALL=2097152 yard c_free_call2M "$k"
    tool w32 "$k" 32
    tool w32_buf512K "$k" 32 --sock-buf 512K
    tool w32_buf1M "$k" 32 --sock-buf 1M
    tool w32_buf2M "$k" 32 --sock-buf 2M
    tool w8_buf1M "$k" 8 --sock-buf 1M
    tool w8 "$k" 8
    if [ "$k" = 16 ]; then
      GPU=1 VERIFY=on CHUNK=8M tool gpu_w32 16 32
      GPU=1 VERIFY=on CHUNK=8M tool gpu_w32_buf1M 16 32 --sock-buf 1M
    fi
  done
  echo "rep $rep $(date -u +%T) $(cat /proc/loadavg)" >> "$L"
done
python3 "$B/table.py" "$J" | tee "$O/profile.md"
