#!/usr/bin/env bash
# 16 sockets, 256 MiB: the yardsticks and the tool per iteration and back to back at 8, 16 and 32
# requests in flight, 3 interleaved repetitions; one JSON line per run on stdout.
set -u
B="$(cd "$(dirname "$0")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"
gcc -O2 -pthread -o "$O/yard" "$B/tcp_yardstick.c" || exit 1
for rep in 1 2 3; do
  TCP_YARDSTICK_FREE=2 timeout 60 "$O/yard" $((256 << 20)) 1 16 1 0 2>/dev/null | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free\",/"
  TCP_YARDSTICK_WALK=1 TCP_YARDSTICK_FREE=2 timeout 60 "$O/yard" $((256 << 20)) 1 16 1 0 2>/dev/null | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free_walk\",/"
  for b in iteration size; do for w in 8 16 32; do
    out=$(timeout 90 "$B/bin/tcpx-run" bench --role local --no-csv --json --verify off --barrier "$b" --channels 1 --socks-per-channel 16 --size 256M --chunk 8M --window "$w" --iters 20 --warmup 2 --sample-ms 10 2>/dev/null | tail -n 1)
    echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["measurements"][0]["recv"]; c=r.get("cpu") or {}; print(json.dumps({"rep":'$rep',"what":"tool_'$b'_w'$w'","gbps":r["algbw_gbs"],"cpu_s_per_gb":c.get("cpu_s_per_gb"),"busy_pct":c.get("busy_pct")}))'
  done; done
done
