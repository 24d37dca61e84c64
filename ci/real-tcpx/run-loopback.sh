#!/usr/bin/env bash
# Runs tcpx-lab against Google's real GPUDirect-TCPX plugin over loopback on one GPU machine:
# host memory, verified bytes, sizes 4K..256M over several channels, next to the socket backend
# (runs interleaved), then the faults it can make: rxdm refusing the flow-steering rule, and the
# peer killed mid-transfer. rxdm is tcpx-lab's stand-in (tcpx-rxdm-standin).
#
#   ci/real-tcpx/run-loopback.sh PLUGIN_SO BIN_DIR LOG_DIR
#
# PLUGIN_SO  libnccl-net.so from build.sh (its abseil/protobuf on LD_LIBRARY_PATH)
# BIN_DIR    holds tcpx-run and tcpx-rxdm-standin (release builds)
# LOG_DIR    receives every output; a summary is printed
#
# Environment: SIZES (default 4K..256M), CHANNELS (4), ITERS (10), ROUNDS (2).
set -uo pipefail
[ $# -eq 3 ] || { echo "usage: $0 PLUGIN_SO BIN_DIR LOG_DIR" >&2; exit 2; }
so=$(realpath "$1"); bin=$(realpath "$2"); mkdir -p "$3"; logs=$(realpath "$3")
sizes=${SIZES:-4K..256M}; channels=${CHANNELS:-4}; iters=${ITERS:-10}; rounds=${ROUNDS:-2}
export NCCL_NVLS_ENABLE=0
prefix=$(mktemp -d /tmp/rxdm-XXXXXX)
standin_pid=
cleanup() {
  [ -n "$standin_pid" ] && kill -TERM "$standin_pid" 2>/dev/null && wait "$standin_pid" 2>/dev/null
  rm -rf "$prefix"
}
trap cleanup EXIT

start_standin() { # $1: accept|refuse, $2: record file
  if [ -n "$standin_pid" ]; then kill -TERM "$standin_pid"; wait "$standin_pid"; standin_pid=; fi
  local mode=(); [ "$1" = refuse ] && mode=(--refuse)
  "$bin/tcpx-rxdm-standin" --prefix "$prefix" --record "$2" "${mode[@]}" 2>>"$logs/standin.log" &
  standin_pid=$!
  for _ in $(seq 200); do [ -S "$prefix/rxdm_application_registry" ] && return 0; sleep 0.05; done
  echo "stand-in did not come up (see standin.log)"; return 1
}

# The plugin warns once per receive task into host memory; keep a count of those, and of the
# rest the first and the last 200 lines.
quiet() {
  awk '/requested receive on host mem buffer/ {n++; next}
       {k++; if (k <= 200) print; else tail[k % 200] = $0}
       END {
         if (k > 400) print "# ... " k - 400 " lines left out ..."
         for (i = (k > 400 ? k - 199 : 201); i <= k; i++) print tail[i % 200]
         print "# plugin warned \"requested receive on host mem buffer\" " n+0 " times"
       }' > "$1"
}

plugin_env=(
  --env "NCCL_NET_PLUGIN=$so"
  --env NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo
  --env NCCL_GPUDIRECTTCPX_CTRL_DEV=lo
  --env "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$prefix"
  --env NCCL_GPUDIRECTTCPX_PORT_BEGIN=50000
  --env NCCL_GPUDIRECTTCPX_PORT_END=50999
  # No rxdm GPU receive memory here (host receives need none): skip its import.
  --env NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0
)
common=(--size "$sizes" --channels "$channels" --iters "$iters" --warmup 2 --no-csv --timeout 60)

start_standin accept "$logs/rules-accept.jsonl" || exit 1
NCCL_NET_PLUGIN=$so NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo \
  NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$prefix NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0 \
  "$bin/tcpx-run" doctor --ifname lo --ctrl-dev lo > "$logs/doctor.txt" 2>&1
echo "== doctor: $(grep -E 'net plugin|rxdm|backends' "$logs/doctor.txt" | cut -c1-300)"

for r in $(seq "$rounds"); do
  for t in netplugin socket; do
    extra=(); [ $t = netplugin ] && extra=("${plugin_env[@]}")
    # tcpx-run's own --timeout covers waits it controls; a call that blocks inside the plugin
    # is not one of them, so bound each run from outside too.
    timeout -s KILL 150 "$bin/tcpx-run" bench --transport $t "${extra[@]}" --memory host "${common[@]}" \
      --name "$t-r$r" --json > "$logs/bench-$t-r$r.txt" 2> >(quiet "$logs/bench-$t-r$r.err")
    echo "== bench $t round $r: exit $?"
  done
done
echo "== rules recorded while benchmarking: $(grep -c install_rule "$logs/rules-accept.jsonl") installs, $(grep -c remove_rule "$logs/rules-accept.jsonl") removals"

# Fault 1: rxdm refuses the rule; accept must fail and say so, within the timeout.
start_standin refuse "$logs/rules-refuse.jsonl" || exit 1
timeout 120 "$bin/tcpx-run" bench --transport netplugin "${plugin_env[@]}" --memory host \
  --size 64K --channels 2 --iters 2 --warmup 1 --no-csv --timeout 20 --name refused \
  2>&1 | quiet "$logs/fault-refuse.txt"
echo "== fault rxdm-refuses: exit ${PIPESTATUS[0]} ; last lines:"; tail -4 "$logs/fault-refuse.txt" | cut -c1-400

# Fault 2: the client (sender) is killed with SIGKILL mid-transfer; the server must fail, not hang.
start_standin accept "$logs/rules-kill.jsonl" || exit 1
"$bin/tcpx-run" bench --role server --peer 127.0.0.1 --port 5399 --transport netplugin \
  "${plugin_env[@]}" --memory host --size 256M --channels "$channels" --iters 400 --warmup 1 \
  --no-csv --timeout 20 --name killed > >(quiet "$logs/fault-kill-server.txt") 2>&1 &
server=$!
for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/5399) 2>/dev/null && break; sleep 0.05; done
"$bin/tcpx-run" bench --role client --peer 127.0.0.1:5399 --transport netplugin \
  "${plugin_env[@]}" --memory host --size 256M --channels "$channels" --iters 400 --warmup 1 \
  --no-csv --timeout 20 --name killed > >(quiet "$logs/fault-kill-client.txt") 2>&1 &
client=$!
# Give the transfer 3 s to be under way (400 x 256 MiB take far longer), then kill the client.
sleep 3
kill -KILL $client; wait $client 2>/dev/null
start=$(date +%s)
timeout 90 tail --pid=$server -f /dev/null \
  || { echo "== server still running 90 s after its peer died: killing it"; kill -KILL $server; }
wait $server; code=$?
echo "== fault peer-killed: server exit $code after $(( $(date +%s) - start )) s; last lines:"
sleep 1 # let the log filter of the dead processes flush
tail -4 "$logs/fault-kill-server.txt" | cut -c1-400
exit 0
