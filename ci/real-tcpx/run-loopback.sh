#!/usr/bin/env bash
# Runs tcpx-lab against Google's real GPUDirect-TCPX plugin over loopback on one GPU machine:
# host memory, verified bytes, sizes 4K..256M at 1 and at 4 channels, in the table mode and in
# the --json mode, next to the socket backend (runs interleaved), ROUNDS rounds; then the faults
# it can make: rxdm refusing the flow-steering rule, and the sender killed mid-transfer (after
# rows have printed). rxdm is tcpx-lab's stand-in (tcpx-rxdm-standin). Exits 1 when any run
# failed, moved a wrong byte, or a fault was not handled as it must be.
#
#   ci/real-tcpx/run-loopback.sh PLUGIN_SO BIN_DIR LOG_DIR
#
# PLUGIN_SO  libnccl-net.so from build.sh (its abseil/protobuf on LD_LIBRARY_PATH)
# BIN_DIR    holds tcpx-run and tcpx-rxdm-standin (release builds)
# LOG_DIR    receives every output; a summary is printed, and results.tsv (round, transport,
#            channels, mode, exit, size, busbw GB/s) from the --json runs
#
# Environment: SIZES (default 4K..256M), CHANNELS (default "1 4"), MODES ("table json"),
# ITERS (10), ROUNDS (3), FAULTS (1; 0 skips the faults), KILL_CHANNELS (4: the peer-killed
# fault's channels), SOCKS (4: sockets per channel, the
# socket backend's --socks-per-channel and the plugin's 1 thread x NCCL_NSOCKS_PERTHREAD). NCCL_DYNAMIC_CHUNK_SIZE is left to
# tcpx-run, which supplies Google's value when it is unset.
set -uo pipefail
[ $# -eq 3 ] || { echo "usage: $0 PLUGIN_SO BIN_DIR LOG_DIR" >&2; exit 2; }
so=$(realpath "$1"); bin=$(realpath "$2"); mkdir -p "$3"; logs=$(realpath "$3")
sizes=${SIZES:-4K..256M}; channel_list=${CHANNELS:-1 4}; modes=${MODES:-table json}
iters=${ITERS:-10}; rounds=${ROUNDS:-3}; faults=${FAULTS:-1}; socks=${SOCKS:-4}
failures=0; runs=0
fail() { echo "== FAIL: $*"; failures=$((failures + 1)); }
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/standin.sh"

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
  # The same sockets per channel as the socket backend's --socks-per-channel.
  --env NCCL_SOCKET_NTHREADS=1 --env "NCCL_NSOCKS_PERTHREAD=$socks"
)
common=(--size "$sizes" --iters "$iters" --warmup 2 --no-csv --timeout 60 --socks-per-channel "$socks")

start_standin accept "$logs/rules-accept.jsonl" || exit 1
NCCL_NET_PLUGIN=$so NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo \
  NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$prefix NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0 \
  "$bin/tcpx-run" doctor --ifname lo --ctrl-dev lo > "$logs/doctor.txt" 2>&1
echo "== doctor: $(grep -E 'net plugin|rxdm|backends|chunk' "$logs/doctor.txt" | cut -c1-300)"

printf 'round\ttransport\tchannels\tmode\texit\tsize\tbusbw_gbs\n' > "$logs/results.tsv"
for r in $(seq "$rounds"); do
  for ch in $channel_list; do
    for mode in $modes; do
      for t in netplugin socket; do
        extra=(); [ $t = netplugin ] && extra=("${plugin_env[@]}")
        json=(); [ "$mode" = json ] && json=(--json)
        name=$t-c$ch-$mode-r$r
        # tcpx-run's own --timeout covers waits it controls, plugin calls included; bound each
        # run from outside too, so a hang anywhere ends as a failure, not as a stuck script.
        timeout -s KILL 150 "$bin/tcpx-run" bench --transport $t "${extra[@]}" --memory host \
          "${common[@]}" --channels "$ch" --name "$name" "${json[@]}" \
          > "$logs/bench-$name.out" 2> >(quiet "$logs/bench-$name.err")
        code=$?; runs=$((runs + 1))
        if [ "$mode" = json ]; then
          rows=$(python3 - "$logs/bench-$name.out" "$r" "$t" "$ch" "$code" <<'PY' 2>&1
import json, sys
path, r, t, ch, code = sys.argv[1:]
doc = json.load(open(path))
assert doc["end"]["wrong_bytes"] == 0, f"wrong bytes {doc['end']['wrong_bytes']}"
for m in doc["measurements"]:
    print(f"{r}\t{t}\t{ch}\tjson\t{code}\t{m['size']}\t{m['recv']['busbw_gbs']:.3f}")
PY
          ) && printf '%s\n' "$rows" >> "$logs/results.tsv" || fail "$name: JSON document: $rows"
        else
          grep -q '^# Wrong bytes : 0$' "$logs/bench-$name.out" || fail "$name: no '# Wrong bytes : 0'"
        fi
        nrows=$(grep -c ' uint8 ' "$logs/bench-$name.out" "$logs/bench-$name.err" | awk -F: '{n+=$2} END {print n}')
        echo "== bench $name: exit $code, $nrows rows"
        [ "$code" = 0 ] || fail "$name: exit $code (see bench-$name.err)"
      done
    done
  done
done
echo "== rules recorded while benchmarking: $(grep -c install_rule "$logs/rules-accept.jsonl") installs, $(grep -c remove_rule "$logs/rules-accept.jsonl") removals"
bench_failures=$failures
[ "$faults" = 1 ] || { echo "== run-loopback: $((runs - failures)) of $runs runs passed (faults skipped)"; [ $failures = 0 ]; exit; }

# Fault 1: rxdm refuses the rule; accept must fail and say so, within the timeout.
start_standin refuse "$logs/rules-refuse.jsonl" || exit 1
timeout 120 "$bin/tcpx-run" bench --transport netplugin "${plugin_env[@]}" --memory host \
  --size 64K --channels 2 --iters 2 --warmup 1 --no-csv --timeout 20 --name refused \
  2>&1 | quiet "$logs/fault-refuse.txt"
code=${PIPESTATUS[0]}
echo "== fault rxdm-refuses: exit $code ; last lines:"; tail -4 "$logs/fault-refuse.txt" | cut -c1-400
[ "$code" != 0 ] && [ "$code" != 137 ] || fail "rxdm-refuses: exit $code (must fail by itself)"

# Fault 2: the sender is killed with SIGKILL mid-transfer, after rows have printed (1M is done,
# 400 x 256M are under way); the receiver must fail within its timeout, naming the peer. Two
# processes, KILL_CHANNELS (4) channels: the plugin takes over 5 s per accept (its flow-steering
# wait), so the server accepts every channel at once to connect within the 20 s.
kill_timeout=20
start_standin accept "$logs/rules-kill.jsonl" || exit 1
kill_env=()
for e in "${plugin_env[@]}"; do case $e in NCCL_GPUDIRECTTCPX_PORT_*) unset 'kill_env[-1]' ;; *) kill_env+=("$e") ;; esac; done
kill_args=(--transport netplugin "${kill_env[@]}" --memory host --size 1M,256M
  --channels "${KILL_CHANNELS:-4}" --iters 400 --warmup 1 --no-csv --timeout $kill_timeout --name killed)
# Two processes, two plugin instances on one host: each takes its own half of the port range,
# from its process environment (the experiment, --env included, must match on both sides).
NCCL_GPUDIRECTTCPX_PORT_BEGIN=50000 NCCL_GPUDIRECTTCPX_PORT_END=50499 \
"$bin/tcpx-run" bench --role server --peer 127.0.0.1 --port 5399 "${kill_args[@]}" \
  > "$logs/fault-kill-server.out" 2> >(quiet "$logs/fault-kill-server.err") &
server=$!
# Wait for the listener without connecting to it (the server takes the first connection as its
# client): port 5399 = 0x1517 in state 0A (LISTEN) in /proc/net/tcp.
for _ in $(seq 200); do grep -q ':1517 00000000:0000 0A' /proc/net/tcp && break; sleep 0.05; done
NCCL_GPUDIRECTTCPX_PORT_BEGIN=50500 NCCL_GPUDIRECTTCPX_PORT_END=50999 \
"$bin/tcpx-run" bench --role client --peer 127.0.0.1:5399 "${kill_args[@]}" \
  > "$logs/fault-kill-client.out" 2> >(quiet "$logs/fault-kill-client.err") &
client=$!
rows=0
for _ in $(seq 600); do # at most 60 s for the 1M row
  grep -q ' uint8 ' "$logs/fault-kill-client.out" 2>/dev/null && { rows=1; break; }
  kill -0 $client 2>/dev/null || break
  sleep 0.1
done
[ $rows = 1 ] || fail "peer-killed: the sender printed no row before it was to be killed"
kill -KILL $client 2>/dev/null; wait $client 2>/dev/null
start=$(date +%s)
timeout $((kill_timeout + 30)) tail --pid=$server -f /dev/null \
  || { fail "peer-killed: receiver still running $((kill_timeout + 30)) s after its peer died"; kill -KILL $server; }
wait $server; code=$?; took=$(( $(date +%s) - start ))
sleep 1 # let the log filters of the ended processes write
echo "== fault peer-killed: receiver exit $code after $took s (timeout $kill_timeout s); rows before: $(grep -c ' uint8 ' "$logs/fault-kill-server.out"); last lines:"
grep -v '^#.*plugin warned' "$logs/fault-kill-server.err" | tail -4 | cut -c1-400
[ "$code" != 0 ] || fail "peer-killed: the receiver exited 0"
[ "$took" -le $((kill_timeout + 5)) ] || fail "peer-killed: the receiver took $took s, over its timeout"
grep -q '127.0.0.1' "$logs/fault-kill-server.err" || fail "peer-killed: the receiver's error names no peer"
echo "== run-loopback: $((runs - bench_failures)) of $runs bench runs passed, faults checked; $failures failure(s) in all"
[ $failures = 0 ]
