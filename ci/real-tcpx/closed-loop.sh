#!/usr/bin/env bash
# The tuning loop closed through Google's GPUDirect-TCPX plugin on one GPU machine (issue 29):
# plans/phase1_plugin.rhai (window, then the plugin's chunk) through the real plugin over
# loopback writes tuned.env; then `tcpx-run validate --net-plugin PLUGIN_SO`, one GPU as 2 NCCL
# hosts, measures NCCL's defaults against tuned.env over the same plugin (send/recv and
# all-reduce, interleaved repetitions, the gain with its interval) and proves from NCCL's own log
# which network it used and that every tuned variable was read. About 5 minutes on one H100.
#
#   ci/real-tcpx/closed-loop.sh PLUGIN_SO BIN_DIR LOG_DIR
#
# PLUGIN_SO  libnccl-net.so from build.sh (QUIET=1 for timing; abseil/protobuf on LD_LIBRARY_PATH)
# BIN_DIR    holds tcpx-run and tcpx-rxdm-standin (release builds)
# LOG_DIR    receives plan.txt, the report directory, tuned.env, validate.json / validate.txt and
#            NCCL's logs (nccl/)
#
# Environment: PLANS (the plans/ folder; default ../../plans from this script), REPS (4), ITERS (10), SIZES (1M,256M) for validate; FLOW_STEERING_WAIT_US
# (100000): the plugin sleeps this long after every accept for the NIC's flow-steering rules to
# take (its own default is 5 s); the stand-in programs no NIC, so over loopback 0.1 s is enough, and
# with 5 s every run of the plan's sequential comparisons took over 5 s (the plan alone ran past
# 280 s). Both validate arms get the same value. Exit: validate's (0 ok, 3 the
# log did not prove what was measured), 1 when the plan wrote no tuned.env.
set -uo pipefail
[ $# -eq 3 ] || { echo "usage: $0 PLUGIN_SO BIN_DIR LOG_DIR" >&2; exit 2; }
so=$(realpath "$1"); bin=$(realpath "$2"); mkdir -p "$3"; logs=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd); plans=${PLANS:-$here/../../plans}
export NCCL_NVLS_ENABLE=0
source "$here/standin.sh"
start_standin accept "$logs/rules.jsonl" || exit 1

# 1. The plan, through the plugin (its variables from the environment; tcpx-run plan supplies
#    NCCL_DYNAMIC_CHUNK_SIZE for the process when it is unset).
wait_us=${FLOW_STEERING_WAIT_US:-100000}
NCCL_NET_PLUGIN=$so NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo \
  NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$prefix NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0 \
  NCCL_GPUDIRECTTCPX_PORT_BEGIN=50000 NCCL_GPUDIRECTTCPX_PORT_END=50999 \
  NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS=$wait_us \
  timeout "${PLAN_TIMEOUT:-330}" "$bin/tcpx-run" plan "$plans/phase1_plugin.rhai" --targets "$plans/targets/loopback.toml" \
  --reports "$logs/reports" --yes 2>&1 | grep -v 'requested receive on host mem buffer' > "$logs/plan.txt"
echo "== plan: $(grep -E '^plan phase1_plugin|^tcpx-run: plan' "$logs/plan.txt" | tail -n 2 | paste -sd' ' -)"
tuned=$(ls "$logs"/reports/*/tuned.env 2>/dev/null | head -1)
[ -n "$tuned" ] || { echo "== no tuned.env (see plan.txt)"; exit 1; }
cp "$tuned" "$logs/tuned.env"
grep -E '^# chosen' "$tuned"

# 2. NCCL over the same plugin, through `tcpx-run validate` on the plan's report: NCCL's defaults
#    (--net-plugin supplies the plugin's A3 chunk where none is set, and GDR level LOC) against
#    tuned.env (its NCCL_NET_PLUGIN is the same library), one GPU as 2 NCCL hosts.
plugin_env=(NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo
  NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX="$prefix" NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0
  NCCL_GPUDIRECTTCPX_PORT_BEGIN=51000 NCCL_GPUDIRECTTCPX_PORT_END=51999
  NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS="$wait_us")
echo "== tuned.env: $(grep -E '^NCCL_' "$tuned" | paste -sd' ' -)"
t0=$(date +%s)
env "${plugin_env[@]}" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
  timeout "${VALIDATE_TIMEOUT:-240}" "$bin/tcpx-run" validate "$(dirname "$tuned")" --json --gpus 0,0 --net-plugin "$so" \
  --reps "${REPS:-4}" --size "${SIZES:-1M,256M}" --iters "${ITERS:-10}" --warmup 2 \
  --nccl-logs "$logs/nccl" > "$logs/validate.json" 2> "$logs/validate.err"
rc=$?
echo "== validate: exit $rc in $(( $(date +%s) - t0 )) s"
python3 "$here/validate-summary.py" "== " "$logs/validate.json" | tee "$logs/validate.txt"
[ $rc -eq 0 ] || tail -n 5 "$logs/validate.err"
exit $rc
