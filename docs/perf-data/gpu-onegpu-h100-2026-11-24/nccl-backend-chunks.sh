#!/usr/bin/env bash
# The tool's nccl backend (one ncclSend/ncclRecv per chunk) at several chunk sizes against NCCL's
# own one-call-per-message figure, all with NCCL tuned for NET/Socket; one GPU as 2 NCCL hosts
# where there is one GPU. Interleaved repetitions. Run from the repository root with the bundle
# in .device-bundle; output to $OUT (else .device-bundle/out)/nccl-chunks.log.
set -u
B=.device-bundle
O="${OUT:-$B/out}"
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0
N=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$N" -ge 2 ]; then DST=1; else DST=0; fi
SOCK="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
TUNED="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
SIZE="${CHUNKS_SIZE:-256M}"
LOG="$O/nccl-chunks.log"
{ date -u; nvidia-smi -L; } >> "$LOG"
for rep in $(seq 1 "${CHUNKS_REPS:-2}"); do
  echo "=== rep $rep nccl one call per message" >> "$LOG"
  env $SOCK $TUNED timeout 120 "$B/bin/tcpx-gpu-bench" nccl --src 0 --dst $DST --sizes "$SIZE" --label tuned >> "$LOG" 2>&1
  # CHUNKS: the chunks to try; "auto" leaves --chunk out (the backend's default).
  for c in ${CHUNKS:-8M 32M 128M $SIZE}; do
    chunk=(--chunk "$c"); [ "$c" = auto ] && chunk=()
    for w in ${WINDOWS:-8 1}; do
      echo "=== rep $rep nccl backend chunk $c window $w" >> "$LOG"
      env $SOCK $TUNED timeout 120 "$B/bin/tcpx-run" bench --transport nccl --channels 1 --memory "cuda:0,$DST" \
        --size "$SIZE" "${chunk[@]}" --window "$w" --iters 5 --warmup 1 --no-csv --timeout 60 --name "nccl-$c-w$w" >> "$LOG" 2>&1
    done
  done
done
grep -E '^(===|nccl-p2p| +[0-9]+ +[0-9]+ +uint8)|error' "$LOG"
