#!/usr/bin/env bash
# `tcpx-run tune` on one GPU machine, then the proof (issue 42):
#   nccl    libnccl send/recv over NET/Socket, one GPU as 2 NCCL hosts: tune from NCCL's defaults
#           with nothing of a hand-found configuration given, then `tcpx-run validate` of the
#           tuned.env it wrote (NCCL's defaults against it, interleaved, NCCL's log as evidence);
#   tcpx    the same through Google's GPUDirect-TCPX plugin (PLUGIN_SO, the rxdm stand-in,
#           GDR level LOC, a short flow-steering wait over loopback);
#   socket  tcpx-lab's socket backend, GPU 0 -> GPU 0 staging at 16 sockets: tune over layout x
#           chunk x window, the full grid of the same space measured point by point, then the
#           tune winner and the grid's best measured again in alternation (the fair comparison).
#
#   ci/real-tcpx/tune-onegpu.sh SUBJECT BIN_DIR OUT_DIR [PLUGIN_SO]
#
# BIN_DIR holds tcpx-run (and tcpx-rxdm-standin for tcpx). Environment (defaults): MINUTES (6)
# and POINTS (60), the tune budget; VREPS (3), VSIZES (1M,256M), VITERS (8) for validate; SIZE
# (256M) of each tune point; FLOW_STEERING_WAIT_US (100000). Writes OUT_DIR/<subject>/: tune.txt
# (progress and result), the run directory (reports/), validate.json, grid.csv (socket).
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 nccl|tcpx|socket BIN_DIR OUT_DIR [PLUGIN_SO]" >&2; exit 2; }
subject=$1; bin=$(realpath "$2"); mkdir -p "$3/$1"; logs=$(realpath "$3/$1"); so=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1
MINUTES=${MINUTES:-6}; POINTS=${POINTS:-60}; SIZE=${SIZE:-256M}
VREPS=${VREPS:-3}; VSIZES=${VSIZES:-1M,256M}; VITERS=${VITERS:-8}
plugin_env=()
plugin_args=()
if [ "$subject" = tcpx ]; then
  [ -f "$so" ] || { echo "tcpx needs PLUGIN_SO (ci/real-tcpx/build.sh makes it)"; exit 2; }
  source "$here/standin.sh"
  start_standin accept "$logs/rules.jsonl" || exit 1
  plugin_env=(NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo
    NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX="$prefix" NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0
    NCCL_GPUDIRECTTCPX_PORT_BEGIN=51000 NCCL_GPUDIRECTTCPX_PORT_END=51999
    NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS="${FLOW_STEERING_WAIT_US:-100000}")
  plugin_args=(--net-plugin "$so")
fi
t0=$(date +%s)
case "$subject" in
  nccl|tcpx)
    env "${plugin_env[@]}" timeout $(( ${MINUTES%.*} * 60 + 120 )) "$bin/tcpx-run" tune "$subject" \
      --minutes "$MINUTES" --points "$POINTS" --size "$SIZE" --reports "$logs/reports" \
      "${plugin_args[@]}" > "$logs/tune.txt" 2>&1
    rc=$?
    echo "== tune $subject: exit $rc in $(( $(date +%s) - t0 )) s"
    grep -vE '^tune: point' "$logs/tune.txt" | grep -v 'requested receive on host mem' | tail -n 25
    dir=$(ls -d "$logs"/reports/*-tune-* 2>/dev/null | tail -n 1)
    [ -n "$dir" ] && [ -f "$dir/tuned.env" ] || { tail -n 20 "$logs/tune.txt"; exit 1; }
    echo "== tuned.env:"; grep -E '^export' "$dir/tuned.env"
    t1=$(date +%s)
    env "${plugin_env[@]}" timeout 300 "$bin/tcpx-run" validate "$dir" --json --gpus 0,0 \
      "${plugin_args[@]}" --reps "$VREPS" --size "$VSIZES" --iters "$VITERS" --warmup 2 \
      --nccl-logs "$logs/validate-logs" > "$logs/validate.json" 2> "$logs/validate.err"
    rc=$?
    echo "== validate: exit $rc in $(( $(date +%s) - t1 )) s"
    python3 "$here/validate-summary.py" "   " "$logs/validate.json"
    [ $rc -eq 0 ] || tail -n 5 "$logs/validate.err"
    exit $rc
    ;;
  socket)
    mem=${MEMORY:-cuda:0,0}
    common=(bench --role local --transport socket --memory "$mem" --size "$SIZE" --iters 6 --warmup 2 --no-csv --json)
    timeout $(( ${MINUTES%.*} * 60 + 60 )) "$bin/tcpx-run" tune socket --memory "$mem" --size "$SIZE" \
      --iters 6 --warmup 2 --minutes "$MINUTES" --points "$POINTS" --reports "$logs/reports" \
      --space layout=1x16,2x8,4x4 --space chunk=2M,4M,8M,16M --space window=4,8,16,32 > "$logs/tune.txt" 2>&1
    echo "== tune socket: exit $? in $(( $(date +%s) - t0 )) s"
    grep -vE '^tune: point' "$logs/tune.txt" | tail -n 12
    dir=$(ls -d "$logs"/reports/*-tune-* 2>/dev/null | tail -n 1)
    figure() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(max(d["measurements"], key=lambda m: m["size"])["recv"]["busbw_gbs"])' 2>/dev/null || echo fail; }
    echo "layout,chunk,window,gbs" > "$logs/grid.csv"
    for l in 1x16 2x8 4x4; do for c in 2M 4M 8M 16M; do for w in 4 8 16 32; do
      g=$(timeout 60 "$bin/tcpx-run" "${common[@]}" --channels "${l%x*}" --socks-per-channel "${l#*x}" \
        --chunk "$c" --window "$w" 2>/dev/null | figure)
      echo "$l,$c,$w,$g" >> "$logs/grid.csv"
    done; done; done
    best=$(grep -v fail "$logs/grid.csv" | tail -n +2 | sort -t, -k4 -g | tail -n 1)
    echo "== grid best: $best ($(( $(date +%s) - t0 )) s)"
    win=$(python3 - "$dir/tune.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["run"]
w = r["outcome"]["winner"] or []
print(" ".join(f'{d["name"]}={d["levels"][i]}' for d, i in zip(r["space"]["dims"], w)))
PY
)
    echo "== tune winner: $win"
    flags() { for kv in "$@"; do k=${kv%%=*}; v=${kv#*=}; case $k in
      layout) echo --channels "${v%x*}" --socks-per-channel "${v#*x}";; *) echo "--$k" "$v";; esac; done; }
    IFS=, read -r bl bc bw _ <<< "$best"
    # shellcheck disable=SC2086
    wf=$(flags $win); bf=$(flags "layout=$bl" "chunk=$bc" "window=$bw")
    for rep in 1 2 3; do
      order="tune grid"; [ $(( rep % 2 )) -eq 0 ] && order="grid tune"
      for arm in $order; do
        f=$wf; [ "$arm" = grid ] && f=$bf
        # shellcheck disable=SC2086
        g=$(timeout 60 "$bin/tcpx-run" "${common[@]}" $f 2>/dev/null | figure)
        echo "recheck rep $rep $arm ($(echo $f)): $g GB/s" | tee -a "$logs/recheck.txt"
      done
    done
    ;;
  *) echo "unknown subject $subject"; exit 2;;
esac
