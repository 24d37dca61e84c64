#!/usr/bin/env bash
# Issue 26 (helper hostpath): free-running plain C TCP (the yardstick) against `tcpx-run bench`
# (socket backend, host memory, one channel of K sockets, 256 MiB, 4 MiB requests, windows 8 and
# 32), the striped layout (default) and the shared layout (TCPX_SOCKET_STRIPE=0) and variants at
# 8 and 16 sockets, GPU 0 -> GPU 0 staging at 16 sockets; interleaved repetitions; every run
# wrapped by /proc/stat snapshots (busy CPUs, context switches per second).
set -u
B="$(cd "$(dirname "$0")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"
J="$O/perf.jsonl"; L="$O/perf.log"; : > "$J"
RUN="$B/tcpx-run"; REPS="${REPS:-4}"; ITERS="${ITERS:-20}"; KS="${KS:-1 2 4 8 16}"
{ echo "machine: $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; uname -r
  echo "tcp_wmem $(cat /proc/sys/net/ipv4/tcp_wmem) tcp_rmem $(cat /proc/sys/net/ipv4/tcp_rmem)"; cat /proc/loadavg
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -n 2; date -u; } | tee "$O/machine.txt"
gcc -O2 -pthread -o "$O/yard" "$B/tcp_yardstick.c" 2>>"$L"; Y="$O/yard"
snap() { awk '/^cpu /{print $2+$3+$4+$7+$8, $7, $5+$6} /^ctxt/{print $2}' /proc/stat | tr '\n' ' '; date +%s.%N; }
measure() { # what k cmd...
  local what="$1" k="$2"; shift 2
  local a b out g
  a=$(snap); out=$(RUS_OUT="$O/rus.json" python3 "$B/rus.py" "$@" 2>>"$L" | tail -n 1); b=$(snap)
  g=$(echo "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin)
import os
if "measurements" in d:
    r=d["measurements"][0]["recv"]; print(r["algbw_gbs"], r.get("wrong_bytes"), os.environ.get("GBX", "0"))
else: print(d["gbps"], None, d["bytes"]/1e9)' 2>>"$L")
  [ -z "$g" ] && { echo "no result: $what k=$k" >> "$L"; return; }
  python3 - "$a" "$b" "$what" "$k" "$g" "$rep" "$O/rus.json" >> "$J" <<'PY'
import sys, json
a=[float(x) for x in sys.argv[1].split()]; b=[float(x) for x in sys.argv[2].split()]
g,w,gb=sys.argv[5].split()
dt=b[4]-a[4]
ru=json.load(open(sys.argv[7]))
print(json.dumps({"rep":int(sys.argv[6]),"what":sys.argv[3],"streams":int(sys.argv[4]),"gbps":float(g),"wrong":w,"gb":float(gb),
 "busy_cpus":round((b[0]-a[0])/100.0/dt,2),"ctxt_per_s":int((b[3]-a[3])/dt),"secs":round(dt,2),**ru}))
PY
}
tool() { local what="$1" k="$2" w="$3" c="$4"; shift 4
  export GBX=$(python3 -c "print(268435456*($ITERS+2)/1e9)")
  measure "$what" "$k" env "$@" timeout 90 "$RUN" bench --role local --no-csv --json --verify off --channels 1 \
    --socks-per-channel "$k" --size 256M --chunk "$c" --window "$w" --iters "$ITERS" --warmup 2; }
gpu() { local what="$1" w="$2"; shift 2
  export GBX=$(python3 -c "print(268435456*11/1e9)")
  measure "$what" 16 env "$@" timeout 120 "$RUN" bench --role local --no-csv --json --verify on --memory cuda:0,0 --channels 1 \
    --socks-per-channel 16 --size 256M --chunk 8M --window "$w" --iters 10 --warmup 1; }
for rep in $(seq 1 "$REPS"); do
  for k in $KS; do
    measure c_free "$k" env TCP_YARDSTICK_FREE=1.5 "$Y" $((256<<20)) 1 "$k" 1 0
    tool w8 "$k" 8 4M
    tool w32 "$k" 32 4M
    RUN="$B/tcpx-run-old" tool before_w8 "$k" 8 4M
    RUN="$B/tcpx-run-old" tool before_w32 "$k" 32 4M
    if [ "$k" -ge 8 ]; then
      tool striped_w32 "$k" 32 4M TCPX_SOCKET_STRIPE=1
      tool t1ps_w8 "$k" 8 4M TCPX_SOCKET_THREADS="$k"
      tool t1ps_w32 "$k" 32 4M TCPX_SOCKET_THREADS="$k"
      tool piece1M_w32 "$k" 32 4M TCPX_SOCKET_PIECE=1M
      tool piece4M_w32 "$k" 32 4M TCPX_SOCKET_PIECE=4M TCPX_SOCKET_CALL=4M
    fi
    if [ "$k" = 16 ]; then
      gpu gpu_w8 8; gpu gpu_w32 32
      RUN="$B/tcpx-run-old" gpu gpu_before_w32 32
    fi
  done
  echo "rep $rep $(date -u +%T) $(cat /proc/loadavg)" >> "$L"
done
python3 "$B/summary.py" "$J" | tee "$O/summary.md"
