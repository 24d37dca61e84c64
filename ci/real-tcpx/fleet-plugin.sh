#!/usr/bin/env bash
# `tcpx-run fleet` over Google's GPUDirect-TCPX plugin on one host: two fleet nodes on `lo`, the
# netplugin backend, tcpx-lab's rxdm stand-in taking (and recording) the flow-steering requests.
# What it shows: a pair run's set-up figure (matrix.csv `setup_ms`) carries the plugin's accept,
# which waits NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS after asking rxdm for its rules
# (1 s here, so it stands out), next to the socket backend's set-up on the same pairs. Exits 1 when
# a run fails, a byte is wrong, or the plugin's set-up does not show the wait.
# Usage: fleet-plugin.sh PLUGIN_SO BIN_DIR LOG_DIR  (LD_LIBRARY_PATH must find the plugin's deps;
# BIN_DIR holds tcpx-run and tcpx-rxdm-standin; SKIP_PLUGIN=1 runs the socket half only, anywhere)
set -u
[ $# -eq 3 ] || { echo "usage: $0 PLUGIN_SO BIN_DIR LOG_DIR" >&2; exit 2; }
so=$(realpath "$1"); bin=$(realpath "$2"); mkdir -p "$3"; logs=$(realpath "$3")
export NCCL_NVLS_ENABLE=0
source "$(dirname "$0")/standin.sh"
start_standin accept "$logs/rules.jsonl" || exit 1

wait_us=1000000
plugin_env=(
  "NCCL_NET_PLUGIN=$so" NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=lo NCCL_GPUDIRECTTCPX_CTRL_DEV=lo
  "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX=$prefix"
  NCCL_GPUDIRECTTCPX_PORT_BEGIN=50000 NCCL_GPUDIRECTTCPX_PORT_END=50999
  NCCL_TCPX_RXMEM_IMPORT_USE_GPU_PCI_CLIENT=0 NCCL_SOCKET_NTHREADS=1 NCCL_NSOCKS_PERTHREAD=2
  NCCL_DYNAMIC_CHUNK_SIZE=524288 "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS=$wait_us"
)
bench=(--size 4M --iters 5 --warmup 1 --channels 1 --socks-per-channel 2 --timeout 30)
failures=0

run_fleet() { # $1: name, $2: transport, the rest: variables for both nodes
  local name=$1 transport=$2; shift 2
  local out="$logs/$name" addr= lead
  env "$@" timeout -s KILL 150 "$bin/tcpx-run" fleet --rank 0 --nodes 2 --listen 127.0.0.1:0 \
    --nics lo --reps 2 --join-timeout 30 --out "$out" --transport "$transport" "${bench[@]}" \
    > "$logs/$name-lead.txt" 2>&1 &
  lead=$!
  for _ in $(seq 300); do
    addr=$(sed -n 's/.*waiting for them on \([0-9.]*:[0-9]*\).*/\1/p' "$logs/$name-lead.txt")
    [ -n "$addr" ] && break; sleep 0.1
  done
  if [ -z "$addr" ]; then
    echo "== FAIL $name: the leader did not say where it waits"; cat "$logs/$name-lead.txt"
    kill -KILL "$lead"; wait "$lead"; failures=$((failures + 1)); return
  fi
  env "$@" timeout -s KILL 150 "$bin/tcpx-run" fleet --rank 1 --nodes 2 --leader "$addr" \
    --nics lo --join-timeout 30 --transport "$transport" "${bench[@]}" > "$logs/$name-follow.txt" 2>&1
  local frc=$?
  wait "$lead"; local lrc=$?
  echo "== $name ($transport): leader exit $lrc, follower exit $frc"
  tail -6 "$logs/$name-lead.txt"
  [ "$frc" -eq 0 ] || { tail -5 "$logs/$name-follow.txt"; failures=$((failures + 1)); }
  python3 - "$out/matrix.csv" "$transport" "$wait_us" <<'EOF' || failures=$((failures + 1))
import csv, statistics, sys
path, transport, wait_us = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    rows = list(csv.DictReader(open(path)))
except OSError as e:
    sys.exit(f"   no matrix: {e}")
bad = [r for r in rows if r["status"] != "ok" or r["wrong_bytes"] not in ("", "0")]
for r in rows:
    print(f"   {r['sender']} -> {r['receiver']} rep {r['rep']}: {r['status']} {r['gbps']} GB/s, "
          f"probe connect {r['connect_ms']} accept {r['accept_ms']} first byte {r['first_byte_ms']} ms, "
          f"bench set-up {r['setup_ms']} ms, wrong bytes {r['wrong_bytes'] or '-'}")
setup = [float(r["setup_ms"]) for r in rows if r["setup_ms"]]
if not rows or bad:
    sys.exit(f"   FAIL: {len(bad)} of {len(rows)} runs not ok")
print(f"   median bench set-up {statistics.median(setup):.1f} ms over {len(setup)} runs")
if transport == "netplugin" and min(setup) < wait_us / 1000:
    sys.exit(f"   FAIL: a set-up below the plugin's flow-steering wait of {wait_us / 1000:.0f} ms")
EOF
}

run_fleet socket socket
[ -n "${SKIP_PLUGIN:-}" ] || run_fleet plugin netplugin "${plugin_env[@]}"
echo "== rules recorded by the stand-in: $(cat "$logs/rules.jsonl" 2>/dev/null | wc -l)"
[ "$failures" -eq 0 ] || { echo "== $failures failure(s)"; exit 1; }
echo "== fleet over the plugin: every run ok"
