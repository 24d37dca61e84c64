#!/usr/bin/env bash
# The watch shim (crates/tcpx-watch-plugin) in front of Google's GPUDirect-TCPX plugin, on ONE GPU
# as two NCCL hosts under torch.distributed, through the rxdm stand-in (issue 41):
#   - send/recv (bytes verified) and all-reduce (sum checked) correct through the shim;
#   - the shim's bytes per rank and per NIC equal what the job moved (NCCL_PROTO=Simple, ranks
#     meeting at the TCP store only, so the network carries the payload alone);
#   - the shim's overhead: the same job with and without it, interleaved, at 1M and 256M;
#   - NCCL_NET=GPUDirectTCPX_v7 pinned in both arms: the shim takes the real plugin's name, and a
#     fallback to NET/Socket fails the run instead of being measured.
#
#   ci/real-tcpx/watch-onegpu.sh PLUGIN_SO SHIM_SO BIN_DIR OUT_DIR
#
# PLUGIN_SO: Google's libnccl-net.so (ci/real-tcpx/build.sh makes it; docs/perf-data/
# issue42-gpu.sh's `tcpx` part leaves it in .device-bundle/tune/so/). SHIM_SO: a release build of
# the shim (`cargo build --release -p tcpx-watch-plugin` -> target/release/libtcpx_watch_plugin.so),
# installed here as libnccl-net-tcpxwatch.so. BIN_DIR holds tcpx-rxdm-standin (and tcpx-run, for
# `tcpx-run watch` on one run). Environment: PYTHON (/opt/torch/.venv/bin/python), REPS (3),
# ITERS (1M=40,256M=8), DEPS_LIB (a directory the plugin's libraries need on LD_LIBRARY_PATH),
# FLOW_STEERING_WAIT_US (100000).
#
# Prints one JSON line per run, one summary line per size and a final verdict line; exit 0 when
# every run was correct and every shim run's bytes were exact. OUT_DIR keeps NCCL's logs (logs/),
# the shim's files per run (watch/), stand-in logs and tcpx-run-watch.txt.
set -uo pipefail
[ $# -eq 4 ] || { echo "usage: $0 PLUGIN_SO SHIM_SO BIN_DIR OUT_DIR" >&2; exit 2; }
so=$(realpath "$1"); shim=$(realpath "$2"); bin=$(realpath "$3"); mkdir -p "$4"; logs=$(realpath "$4")
[ -f "$so" ] || { echo "no plugin at $1 (ci/real-tcpx/build.sh makes it)" >&2; exit 2; }
[ -f "$shim" ] || { echo "no shim at $2 (cargo build --release -p tcpx-watch-plugin)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-/opt/torch/.venv/bin/python}
mkdir -p "$logs/shim"
cp "$shim" "$logs/shim/libnccl-net-tcpxwatch.so"
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
  f=$(find /usr/local/lib /usr/lib /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1)
  [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[ -n "${DEPS_LIB:-}" ] && export LD_LIBRARY_PATH="$DEPS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi -L; nproc; uname -r
source "$here/standin.sh"
start_standin accept "$logs/rules.jsonl" || exit 1
export NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_NET_GDR_LEVEL=LOC \
  NCCL_DYNAMIC_CHUNK_SIZE=524288 \
  NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo \
  NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX="$prefix" NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0 \
  NCCL_GPUDIRECTTCPX_PORT_BEGIN=51000 NCCL_GPUDIRECTTCPX_PORT_END=51999 \
  NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS="${FLOW_STEERING_WAIT_US:-100000}"
watch_args=()
[ -x "$bin/tcpx-run" ] && watch_args=(--tcpx-run "$bin/tcpx-run")
t0=$(date +%s)
timeout 560 "$PYTHON" "$here/watch-onegpu.py" "$logs" "$so" "$logs/shim" \
  --reps "${REPS:-3}" --iters "${ITERS:-1M=40,256M=8}" "${watch_args[@]}" | tee "$logs/runs.jsonl"
rc=${PIPESTATUS[0]}
echo "== watch-onegpu: exit $rc in $(( $(date +%s) - t0 )) s"
[ -f "$logs/tcpx-run-watch.txt" ] && { echo "== tcpx-run watch (one shim run):"; head -n 40 "$logs/tcpx-run-watch.txt"; }
exit "$rc"
