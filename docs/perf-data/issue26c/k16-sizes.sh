#!/usr/bin/env bash
# Run from a folder holding a release tcpx-run and xtask/src/tcp_yardstick.c (the device call copied both beside it).
# 16 sockets: the walking yardstick against the tool at 256M, 1G and 2G per iteration (8M x 32),
# 3 interleaved repetitions. Rows to $OUT/k16.jsonl.
set -u
B="$(cd "$(dirname "$0")" && pwd)"
gcc -O2 -pthread -o "$OUT/tcp_yardstick" "$B/tcp_yardstick.c" || exit 2
Y="$OUT/tcp_yardstick"
nproc; uname -r
for rep in 1 2 3; do
  for walk in 1 0; do
    TCP_YARDSTICK_WALK=$walk TCP_YARDSTICK_FREE=2 timeout 60 "$Y" 268435456 1 16 1 0 2>/dev/null | sed "s/^{/{\"rep\":$rep,\"walk\":$walk,/" >> "$OUT/k16.jsonl"
  done
  for s in 256M:24 1G:6 2G:3 4G:2; do
    sz=${s%%:*}; it=${s##*:}
    for w in 32; do
    out=$(timeout 120 "$B/tcpx-run" bench --role local --no-csv --json --verify off --channels 1 --socks-per-channel 16 --size "$sz" --chunk 8M --window $w --iters "$it" --warmup 1 --sample-ms 10 2>>"$OUT/err.log" | tail -n 1)
    g=$(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["measurements"][0]["recv"]; c=(r.get("cpu") or {}); print(json.dumps({"gbps":r["algbw_gbs"],"cpu_s_per_gb":c.get("cpu_s_per_gb")}))' 2>>"$OUT/err.log")
    echo "{\"rep\":$rep,\"tool\":\"$sz\",\"window\":$w,\"r\":$g}" >> "$OUT/k16.jsonl"
    done
  done
done
cat "$OUT/k16.jsonl"
