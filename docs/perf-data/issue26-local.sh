#!/bin/bash
# local 2-core: free-running yardstick vs tool, 3 interleaved reps; "t0" rows are TCPX_SOCKET_THREADS=0 (automatic: when this
# ran, half the CPUs, i.e. one thread per side on 2 CPUs; since then a thread per socket below 16 CPUs), "tK" one thread per socket.
J=${1:-/tmp/local26.jsonl}; : > $J
run=${TCPX_RUN:-target/release/tcpx-run}; YARD=${YARD:-/tmp/ys26}  # gcc -O2 -pthread -o /tmp/ys26 xtask/src/tcp_yardstick.c
echo "start load: $(cat /proc/loadavg)"
for rep in 1 2 3; do for k in 1 2 4 8 16; do
  TCP_YARDSTICK_FREE=1.5 "$YARD" $((256<<20)) 1 $k 1 0 | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free\",/" >> $J
  for w in 8 32; do for th in 0 $k; do
    g=$(TCPX_SOCKET_THREADS=$th timeout 120 $run bench --role local --no-csv --json --verify off --channels 1 --socks-per-channel $k --size 256M --chunk 4M --window $w --iters 10 --warmup 2 2>/dev/null | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["measurements"][0]["recv"]["algbw_gbs"])')
    [ -n "$g" ] && echo "{\"rep\":$rep,\"what\":\"t${th}_w$w\",\"streams\":$k,\"gbps\":$g}" >> $J
  done; done
done; echo "rep $rep load $(cat /proc/loadavg)"; done
