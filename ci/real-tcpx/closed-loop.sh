#!/usr/bin/env bash
# The tuning loop closed through Google's GPUDirect-TCPX plugin on one GPU machine (issue 29):
# plans/phase1_plugin.rhai (window, then the plugin's chunk) through the real plugin over
# loopback writes tuned.env; then NCCL, one GPU as two NCCL hosts (onegpu-nccl.py), measures the
# plugin's defaults against tuned.env's NCCL variables over the same plugin, interleaved, with
# what NCCL's log says it used and read. About 4 minutes on one H100.
#
#   ci/real-tcpx/closed-loop.sh PLUGIN_SO BIN_DIR LOG_DIR
#
# PLUGIN_SO  libnccl-net.so from build.sh (QUIET=1 for timing; abseil/protobuf on LD_LIBRARY_PATH)
# BIN_DIR    holds tcpx-run and tcpx-rxdm-standin (release builds)
# LOG_DIR    receives plan.txt, the report directory, tuned.env and loop-nccl.jsonl
#
# Environment: REPS (3), ITERS (5), SIZE (268435456) for the NCCL arms.
set -uo pipefail
[ $# -eq 3 ] || { echo "usage: $0 PLUGIN_SO BIN_DIR LOG_DIR" >&2; exit 2; }
so=$(realpath "$1"); bin=$(realpath "$2"); mkdir -p "$3"; logs=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd); plans=$here/../../plans
export NCCL_NVLS_ENABLE=0
prefix=$(mktemp -d /tmp/rxdm-XXXXXX)
"$bin/tcpx-rxdm-standin" --prefix "$prefix" --record "$logs/rules.jsonl" 2>>"$logs/standin.log" &
standin=$!
trap 'kill -TERM $standin 2>/dev/null; wait $standin 2>/dev/null; rm -rf "$prefix"' EXIT
for _ in $(seq 200); do [ -S "$prefix/rxdm_application_registry" ] && break; sleep 0.05; done
[ -S "$prefix/rxdm_application_registry" ] || { echo "stand-in did not come up"; exit 1; }

# 1. The plan, through the plugin (its variables from the environment; tcpx-run plan supplies
#    NCCL_DYNAMIC_CHUNK_SIZE for the process when it is unset).
NCCL_NET_PLUGIN=$so NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo \
  NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$prefix NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0 \
  NCCL_GPUDIRECTTCPX_PORT_BEGIN=50000 NCCL_GPUDIRECTTCPX_PORT_END=50999 \
  timeout 280 "$bin/tcpx-run" plan "$plans/phase1_plugin.rhai" --targets "$plans/targets/loopback.toml" \
  --reports "$logs/reports" --yes 2>&1 | grep -v 'requested receive on host mem buffer' > "$logs/plan.txt"
echo "== plan: $(grep -E '^plan phase1_plugin' "$logs/plan.txt")"
tuned=$(ls "$logs"/reports/*/tuned.env 2>/dev/null | head -1)
[ -n "$tuned" ] || { echo "== no tuned.env (see plan.txt)"; exit 1; }
cp "$tuned" "$logs/tuned.env"
grep -E '^# chosen' "$tuned"

# 2. NCCL over the same plugin: Google's defaults (with its A3 chunk, without which the plugin
#    stalls) against tuned.env's NCCL variables. tuned.env's NCCL_NET_PLUGIN is the same library.
base="NCCL_NET_PLUGIN=$so,NCCL_NET_GDR_LEVEL=LOC,NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo"
base+=",NCCL_GPUDIRECTTCPX_CTRL_DEV=lo,NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$prefix"
base+=",NCCL_GPUDIRECTTCPX_PORT_BEGIN=51000,NCCL_GPUDIRECTTCPX_PORT_END=51999"
base+=",NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0"
vars=$(grep -E '^NCCL_[A-Z0-9_]+=[A-Za-z0-9_./:-]*$' "$tuned" | grep -v '^NCCL_NET_PLUGIN=' | paste -sd, -)
echo "== tuned NCCL variables: $vars"
PYTHONUNBUFFERED=1 timeout 240 python3 "$here/onegpu-nccl.py" "$logs/nccl" \
  "default=$base,NCCL_DYNAMIC_CHUNK_SIZE=524288" "tuned=$base,$vars" \
  --reps "${REPS:-3}" --iters "${ITERS:-5}" --size "${SIZE:-268435456}" | tee "$logs/loop-nccl.jsonl"
python3 - "$logs/loop-nccl.jsonl" <<'PY'
import json, statistics as st, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {a: sorted((r for r in runs if r["arm"] == a), key=lambda r: r["rep"]) for a in ("default", "tuned")}
for metric in ("sendrecv_busbw_gbs", "allreduce_busbw_gbs"):
    pairs = [(d.get(metric), t.get(metric)) for d, t in zip(by["default"], by["tuned"])]
    ratios = [t / d for d, t in pairs if d and t]
    if ratios:
        print(f"== {metric}: tuned/default per repetition {[round(r, 3) for r in ratios]}, "
              f"median {st.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    else:
        print(f"== {metric}: no pair of runs finished")
for r in runs:
    print(f"== {r['arm']} rep {r['rep']}: network {r['nccl_log']['network']}, "
          f"{'error: ' + r['error'][:200] if 'error' in r else 'ok'}")
PY
