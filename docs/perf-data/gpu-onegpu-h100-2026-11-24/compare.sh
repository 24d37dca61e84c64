#!/usr/bin/env bash
# GPU -> GPU over loopback TCP, NCCL NET/Socket against the socket backend, on whatever GPUs the
# machine has (one GPU: GPU 0 -> GPU 0, NCCL's two ranks as 2 NCCL hosts, a process each).
# Interleaved: every configuration once per repetition, so a slow spell hits all of them.
# Run from the repository root with the bundle of `cargo xtask gpu-test` in .device-bundle:
#   bash docs/perf-data/gpu-onegpu-h100-2026-11-24/compare.sh
# Output: $OUT (else .device-bundle/out)/compare.jsonl (one RESULT object per line, with "rep")
# and compare.log.
set -u
B=.device-bundle
O="${OUT:-$B/out}"
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1
bench="$B/bin/tcpx-gpu-bench"
N=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$N" -ge 2 ]; then DST=1; else DST=0; fi
SIZES="${COMPARE_SIZES:-256M,1G}"
REPS="${COMPARE_REPS:-3}"
SOCK="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
# NCCL's point-to-point knobs: 4 sockets x 4 threads per connection; then also 4 channels per
# network peer, 512 KiB network chunks and an 8 MiB buffer (the values NCCL's and vendors' tuning
# guides start from).
declare -A NCCL_CONF=(
  [nccl-default]=""
  [nccl-4x4]="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4"
  [nccl-4x4-tuned]="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=524288 NCCL_BUFFSIZE=8388608"
  # Further along the same knobs, for the sweep (COMPARE_CONFS picks configurations).
  [nccl-4x4-ch8]="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=8 NCCL_P2P_NET_CHUNKSIZE=524288 NCCL_BUFFSIZE=8388608"
  [nccl-4x4-ch4-2m]="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
  [nccl-4x4-ch8-2m]="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=8 NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
  [nccl-4x4-ch2-2m]="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=2 NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
  [nccl-4x4-ch4-4m]="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=4194304 NCCL_BUFFSIZE=33554432"
  [nccl-4x4-ch4-8m]="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=8388608 NCCL_BUFFSIZE=67108864"
  [nccl-default-ch4-4m]="NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=4194304 NCCL_BUFFSIZE=33554432"
  [nccl-8x8-ch4]="NCCL_NSOCKS_PERTHREAD=8 NCCL_SOCKET_NTHREADS=8 NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=524288 NCCL_BUFFSIZE=8388608"
)
CONFS="${COMPARE_CONFS:-nccl-default nccl-4x4 nccl-4x4-tuned socket-1x16 socket-4x4}"
{ date -u; nvidia-smi -L; nproc; uname -r; } >> "$O/compare.log" 2>&1
tag() { python3 -c 'import json,sys
rep=int(sys.argv[1]); conf=sys.argv[2]
for l in sys.stdin:
    if l.startswith("RESULT "):
        r=json.loads(l[7:]); r["rep"]=rep; r["conf"]=conf; print(json.dumps(r, sort_keys=True))' "$@"; }
for rep in $(seq 1 "$REPS"); do
  for conf in $CONFS; do
    echo "=== rep $rep $conf" >> "$O/compare.log"
    case "$conf" in
      nccl-*)
        env $SOCK ${NCCL_CONF[$conf]} timeout 200 "$bench" nccl --src 0 --dst $DST --sizes "$SIZES" --label "$conf" 2>&1 ;;
      socket-*x*)
        # socket-CxK: C channels of K sockets each.
        shape=${conf#socket-}
        timeout 200 "$bench" socket --src 0 --dst $DST --sizes "$SIZES" --socks "${shape#*x}" --channels "${shape%x*}" 2>&1 ;;
      *) echo "unknown configuration $conf" ;;
    esac | tee -a "$O/compare.log" | tag "$rep" "$conf" >> "$O/compare.jsonl"
  done
done
grep -E '^(nccl-p2p|socket-gpu|===|tcpx-gpu-bench: error)' "$O/compare.log"
