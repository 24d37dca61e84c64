#!/usr/bin/env bash
# Issue 26's device measurement, one call: free-running plain C TCP (the yardstick) against
# `tcpx-run bench` (socket backend, host memory, one channel of K sockets) at K = 1, 4, 8, 16,
# windows 8 and 32, 4 MiB requests as the issue measured; at 16 sockets also one thread per
# socket (TCPX_SOCKET_THREADS=K), at 16 four threads and the old piece rule (TCPX_SOCKET_PIECE=0),
# and 8 MiB requests; GPU 0 -> GPU 0 staging at 16 sockets. (Call 1 compared piece rules instead:
# TCPX_SOCKET_PIECE=0/1M/4M, TCPX_SOCKET_CALL=256K.)
# Repetitions interleave every run. Usage: perf26.sh BUNDLE_DIR OUT_DIR [REPS]
set -u
B="$1"; O="$2"; REPS="${3:-5}"
run="$B/tcpx-run"; J="$O/perf.jsonl"; L="$O/perf.log"
: > "$J"
{
  echo "machine: $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "kernel: $(uname -r); tcp_wmem: $(cat /proc/sys/net/ipv4/tcp_wmem); tcp_rmem: $(cat /proc/sys/net/ipv4/tcp_rmem)"
  echo "load: $(cat /proc/loadavg)"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -n 2
} | tee "$O/machine.txt"
YARD="$O/tcp_yardstick"
gcc -O2 -pthread -o "$YARD" "$B/tcp_yardstick.c" 2>>"$L" || YARD="$B/tcp_yardstick"
SIZE=256M; BYTES=$((256 << 20)); ITERS="${PERF_ITERS:-40}"
tool() { # what k window chunk [env...]
  local what="$1" k="$2" w="$3" c="$4"; shift 4
  local out g
  out=$(env "$@" timeout 60 "$run" bench --role local --no-csv --json --verify off --channels 1 \
    --socks-per-channel "$k" --size "$SIZE" --chunk "$c" --window "$w" --iters "$ITERS" --warmup 2 2>>"$L" | tail -n 1)
  g=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["measurements"][0]["recv"]["algbw_gbs"])' 2>>"$L")
  [ -n "$g" ] && echo "{\"rep\":$rep,\"what\":\"$what\",\"streams\":$k,\"gbps\":$g}" >> "$J"
}
for rep in $(seq 1 "$REPS"); do
  for k in 1 4 8 16; do
    TCP_YARDSTICK_FREE=1.5 timeout 60 "$YARD" "$BYTES" 1 "$k" 1 0 2>>"$L" | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free\",/" >> "$J"
    for w in 8 32; do tool "new_w$w" "$k" "$w" 4M; done
    if [ "$k" = 16 ]; then
      for w in 8 32; do
        tool "t1ps_w$w" "$k" "$w" 4M TCPX_SOCKET_THREADS="$k"
        tool "t4_w$w" "$k" "$w" 4M TCPX_SOCKET_THREADS=4
        tool "oldpieces_w$w" "$k" "$w" 4M TCPX_SOCKET_PIECE=0
      done
    fi
    [ "$k" = 16 ] && for w in 8 32; do tool "new8M_w$w" 16 "$w" 8M; done
  done
  for w in 8 32; do
    out=$(timeout 120 "$run" bench --role local --no-csv --json --verify on --memory "cuda:0,0" --channels 1 \
      --socks-per-channel 16 --size 256M --chunk 8M --window "$w" --iters 10 --warmup 1 2>>"$L" | tail -n 1)
    g=$(echo "$out" | python3 -c 'import json,sys; m=json.load(sys.stdin)["measurements"][0]; print(m["recv"]["algbw_gbs"], m["recv"].get("wrong_bytes", m["recv"].get("wrong", "?")))' 2>>"$L")
    [ -n "$g" ] && echo "{\"rep\":$rep,\"what\":\"gpu_w$w\",\"streams\":16,\"gbps\":${g%% *},\"wrong\":\"${g#* }\"}" >> "$J"
  done
  echo "rep $rep done $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$L"
done
python3 - "$J" <<'EOF' | tee "$O/summary.md"
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["what"], r["streams"], r["rep"]): r["gbps"] for r in rows}
reps = sorted({r["rep"] for r in rows})
whats = []
for r in rows:
    if r["what"] not in whats: whats.append(r["what"])
print("reps:", len(reps), "| wrong bytes (GPU):", sorted({str(r.get("wrong")) for r in rows if "wrong" in r}))
print("| run | K | GB/s median [min-max] | / yardstick median [min-max] |")
print("|---|---:|---:|---:|")
for k in (1, 4, 8, 16):
    for w in whats:
        v = [by[(w, k, p)] for p in reps if (w, k, p) in by]
        if not v: continue
        q = [by[(w, k, p)] / by[("c_free", k, p)] for p in reps if (w, k, p) in by and by.get(("c_free", k, p))]
        rs = "%.2f [%.2f-%.2f]" % (st.median(q), min(q), max(q)) if q else "-"
        print("| %s | %d | %.2f [%.2f-%.2f] | %s |" % (w, k, st.median(v), min(v), max(v), rs))
EOF
