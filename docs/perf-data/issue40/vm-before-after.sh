#!/usr/bin/env bash
# The 2-core VM's check for issue 40: `tcpx-run bench` with no chunk or window flags, the binary
# before the auto rule (BEFORE) against the one with it (AFTER), and free-running C, at K = 1, 2,
# 4, 8, 16 sockets (one channel), host memory, 64 MiB, --verify off, interleaved, REPS times.
#   bash docs/perf-data/issue40/vm-before-after.sh BEFORE_BIN AFTER_BIN YARDSTICK_BIN > out.jsonl
set -uo pipefail
BEFORE=$1 AFTER=$2 YARD=$3 REPS=${REPS:-3} SIZE=${SIZE:-64M}
bytes=$(( ${SIZE%M} << 20 ))
for rep in $(seq 1 "$REPS"); do
  for k in ${KS:-1 2 4 8 16}; do
    line=$(TCP_YARDSTICK_FREE=2 timeout 60 "$YARD" "$bytes" 1 "$k" 1 0 | tail -n 1)
    echo "{\"rep\":$rep,\"k\":$k,\"name\":\"c_free\",\"line\":$line}"
    for which in before after; do
      bin=$BEFORE; [ $which = after ] && bin=$AFTER
      gbs=$(timeout 120 "$bin" bench --role local --no-csv --json --verify off --channels 1 \
        --socks-per-channel "$k" --size "$SIZE" --iters 30 --warmup 3 2>/dev/null \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["measurements"][-1]["recv"]["algbw_gbs"])')
      echo "{\"rep\":$rep,\"k\":$k,\"name\":\"$which\",\"gbs\":${gbs:-null}}"
    done
  done
done
