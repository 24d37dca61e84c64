#!/usr/bin/env bash
# `tcpx-run validate` on ONE GPU as 2 NCCL hosts, with NCCL's own log as evidence (issue 29):
#   1. NET/Socket over lo: NCCL defaults against a tuned.env (NCCL_NSOCKS_PERTHREAD=4,
#      NCCL_SOCKET_NTHREADS=4);
#   2. Google's GPUDirect-TCPX plugin (PLUGIN_SO, given with --net-plugin: GDR level LOC, never a
#      zero chunk), its defaults against a tuned.env, through the rxdm stand-in;
#   3. a plugin path that does not exist, to show what a silent fallback looks like (expected:
#      status "unproven", exit 3, if NCCL falls back to its own Socket transport).
#
#   validate-onegpu.sh PLUGIN_SO BIN_DIR OUT_DIR      (PLUGIN_SO may be "-" to skip 2 and 3)
#
# BIN_DIR holds tcpx-run and tcpx-rxdm-standin. REPS, SIZES, ITERS override the defaults.
# Each step writes OUT_DIR/<step>.json (one document) and OUT_DIR/<step>.err; NCCL's logs go to
# OUT_DIR/logs-<step>/. Exit 0 when steps 1 and 2 came back "ok" with the network they asked for.
set -u
SO=$1; BIN=$2; O=$3
mkdir -p "$O"
REPS=${REPS:-4}; SIZES=${SIZES:-1M,64M,256M}; ITERS=${ITERS:-10}
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
  f=$(find /usr/local/lib /usr/lib /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1)
  [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
here=$(cd "$(dirname "$0")" && pwd)
summary() { python3 "$here/validate-summary.py" "  " "$1"; } # status, figures and evidence
rc=0
t0=$(date +%s)

echo "== 1. NET/Socket, one GPU as 2 NCCL hosts"
printf 'NCCL_NSOCKS_PERTHREAD=4\nNCCL_SOCKET_NTHREADS=4\n' > "$O/tuned-socket.env"
NCCL_NET=Socket timeout 280 "$BIN/tcpx-run" validate "$O/tuned-socket.env" --json --gpus 0,0 \
  --reps "$REPS" --size "$SIZES" --iters "$ITERS" --warmup 2 --nccl-logs "$O/logs-socket" \
  > "$O/socket.json" 2> "$O/socket.err"
r=$?; echo "  exit $r in $(( $(date +%s) - t0 )) s"; summary "$O/socket.json"
grep -q '"status":"ok"' "$O/socket.json" || rc=1

if [ "$SO" != "-" ] && [ -f "$SO" ]; then
  echo "== 2. Google's GPUDirect-TCPX plugin $SO, one GPU as 2 NCCL hosts"
  # The stand-in serves a temporary prefix; standin.sh stops it and removes the prefix on exit.
  bin=$BIN; logs=$O
  source "$here/standin.sh"
  start_standin accept "$O/rules.jsonl" || rc=1
  printf 'NCCL_DYNAMIC_CHUNK_SIZE=1048576\nNCCL_NSOCKS_PERTHREAD=4\nNCCL_SOCKET_NTHREADS=1\n' > "$O/tuned-plugin.env"
  t1=$(date +%s)
  NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo \
  NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX="$prefix" NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0 \
  NCCL_GPUDIRECTTCPX_PORT_BEGIN=51000 NCCL_GPUDIRECTTCPX_PORT_END=51999 \
    timeout 300 "$BIN/tcpx-run" validate "$O/tuned-plugin.env" --json --gpus 0,0 \
    --net-plugin "$SO" --reps "$REPS" --size "$SIZES" --iters "$ITERS" --warmup 2 \
    --nccl-logs "$O/logs-plugin" > "$O/plugin.json" 2> "$O/plugin.err"
  r=$?; echo "  exit $r in $(( $(date +%s) - t1 )) s"; summary "$O/plugin.json"
  grep -q '"status":"ok"' "$O/plugin.json" || rc=1
  grep -q 'GPUDirectTCPX' "$O/plugin.json" || rc=1

  echo "== 3. a plugin that does not exist: the fallback must be flagged"
  t2=$(date +%s)
  timeout 120 "$BIN/tcpx-run" validate "$O/tuned-socket.env" --json --gpus 0,0 \
    --net-plugin /nonexistent/libnccl-net.so --reps 1 --size 1M --iters 3 --warmup 1 \
    --nccl-logs "$O/logs-fallback" > "$O/fallback.json" 2> "$O/fallback.err"
  r=$?; echo "  exit $r in $(( $(date +%s) - t2 )) s (3 = flagged)"; summary "$O/fallback.json"
else
  echo "== 2, 3: SKIP: no plugin .so ($SO)"
fi
echo "== validate-onegpu.sh: rc $rc in $(( $(date +%s) - t0 )) s"
exit $rc
