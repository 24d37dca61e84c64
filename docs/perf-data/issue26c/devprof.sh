#!/usr/bin/env bash
# System-wide cpu-clock profiles of the free-running yardstick (hot and walking receive buffers)
# and tcpx-run bench (socket, host memory) over a 2 s steady-state window each; bytes from lo's
# rx counter over the same window. Output: $O/prof.jsonl (one summary per run), *.folded.gz.
set -u
B="$(cd "$(dirname "$0")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Debian's perf and its libraries carried in the bundle (perf/), or the system's perf where there is none.
if [ -x "$B/perf/perf" ]; then PERF() { "$B/perf/lib/ld-linux-x86-64.so.2" --library-path "$B/perf/lib" "$B/perf/perf" "$@"; }
else PERF() { perf "$@"; }; fi
# TOOL_MODES: `it` (a barrier before every timed iteration, the default) and/or `b2b` (the timed
# iterations back to back, `--barrier size`; profile names tool_b2b_*).
L="$O/prof.log"; J="$O/prof.jsonl"; : > "$J"
{ echo "machine: $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; uname -r; cat /proc/loadavg; date -u
  for f in /proc/sys/kernel/perf_event_paranoid /proc/sys/kernel/kptr_restrict /sys/kernel/mm/transparent_hugepage/enabled /proc/sys/net/ipv4/tcp_wmem /proc/sys/net/ipv4/tcp_rmem; do echo "$f: $(cat $f 2>&1)"; done; id; } > "$O/machine.txt" 2>&1
PERF --version >> "$O/machine.txt" 2>&1
if ! PERF record -e cpu-clock -a -g -F 999 -o /tmp/ptest.data -- sleep 0.3 > "$O/perf-test.txt" 2>&1; then
  echo "PERF FAILED"; cat "$O/perf-test.txt"; exit 1
fi
PERF script -i /tmp/ptest.data -F comm,tid,ip,sym 2>&1 | head -40 >> "$O/perf-test.txt"
gcc -O2 -pthread -o "$O/yard" "$B/tcp_yardstick.c" || exit 1
NCPU=$(nproc); HZ=${HZ:-1999}; WIN=${WIN:-2}
lo() { cat /sys/class/net/lo/statistics/rx_bytes; }
prof() { local name="$1" lead="$2"; shift 2
  "$@" > "$O/$name.out" 2>>"$L" & local pid=$!
  sleep "$lead"
  # The window is the profiled command itself: lo's byte counter and the clock read inside it.
  PERF record -q --no-buildid -e cpu-clock -a -g -F "$HZ" -o /tmp/p.data -- sh -c "cat /sys/class/net/lo/statistics/rx_bytes > /tmp/b0; date +%s.%N > /tmp/t0; sleep $WIN; cat /sys/class/net/lo/statistics/rx_bytes > /tmp/b1; date +%s.%N > /tmp/t1" >>"$L" 2>&1
  wait $pid
  PERF script -i /tmp/p.data -F comm,tid,ip,sym 2>>"$L" | python3 "$B/fold.py" "$name" "$HZ" "$(python3 -c "print($(cat /tmp/t1) - $(cat /tmp/t0))")" "$(( $(cat /tmp/b1) - $(cat /tmp/b0) ))" "$NCPU" "$O" >> "$J" 2>>"$L"
  tail -n 1 "$J" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["name"], d["gbps"], "GB/s", d["cpu_s_per_gb"], "CPU-s/GB", d["cpus_busy"], "CPUs busy", d["cpus_idle"], "idle", {k: v for k, v in d["groups_ms_per_gb"].items() if not k.startswith("other")})'
}
for k in ${KS-1 4 16}; do
  it=$((80 * k)); [ $it -gt 600 ] && it=600
  # The yardstick fills 2 x K x 256 MiB before its clock starts (about 0.2 s per stream).
  lead=$(python3 -c "print(1.5 + 0.25 * $k)"); secs=$(python3 -c "print($lead + $WIN + 2)")
  prof "c_free_k$k" "$lead" env TCP_YARDSTICK_FREE="$secs" "$O/yard" $((256 << 20)) 1 "$k" 1 0
  prof "c_free_walk_k$k" "$lead" env TCP_YARDSTICK_FREE="$secs" TCP_YARDSTICK_WALK=1 "$O/yard" $((256 << 20)) 1 "$k" 1 0
  for mode in ${TOOL_MODES:-it}; do
    case "$mode" in it) tag=""; extra="";; b2b) tag="_b2b"; extra="--barrier size";; *) echo "TOOL_MODES: it or b2b, not $mode"; exit 2;; esac
    prof "tool${tag}_w32_k$k" 2.5 timeout 60 "$B/bin/tcpx-run" bench --role local --no-csv --json --verify off --channels 1 --socks-per-channel "$k" --size 256M --chunk 8M --window 32 --iters "$it" --warmup 2 $extra
  done
  [ "$k" = 16 ] && TCPX_SOCKET_THREADS=16 TCPX_SOCKET_BLOCKING=1 prof "tool_blocking_w32_k$k" 2.5 timeout 60 "$B/bin/tcpx-run" bench --role local --no-csv --json --verify off --channels 1 --socks-per-channel "$k" --size 256M --chunk 8M --window 32 --iters "$it" --warmup 2
done
date -u >> "$O/machine.txt"
offcpu() { local name="$1" lead="$2"; shift 2
  "$@" > "$O/$name.out" 2>>"$L" & local pid=$!
  sleep "$lead"
  ls /proc/$pid/task > /tmp/tids 2>/dev/null; for c in $(cat /proc/$pid/task/*/children 2>/dev/null); do ls /proc/$c/task >> /tmp/tids 2>/dev/null; done
  PERF record -q --no-buildid -e sched:sched_switch -a -g -o /tmp/s.data -- sh -c "cat /sys/class/net/lo/statistics/rx_bytes > /tmp/b0; date +%s.%N > /tmp/t0; sleep $OFFWIN; cat /sys/class/net/lo/statistics/rx_bytes > /tmp/b1; date +%s.%N > /tmp/t1" >>"$L" 2>&1 || echo "sched_switch record failed: see prof.log"
  wait $pid
  PERF script -i /tmp/s.data -F comm,tid,time,event,trace,ip,sym 2>>"$L" | python3 "$B/offcpu.py" /tmp/tids "$name" "$(python3 -c "print($(cat /tmp/t1) - $(cat /tmp/t0))")" "$(( $(cat /tmp/b1) - $(cat /tmp/b0) ))" >> "$O/offcpu.jsonl" 2>>"$L"
  tail -n 1 "$O/offcpu.jsonl"
}
OFFWIN=${OFFWIN:-0.5}
for k in ${OFFKS:-}; do
  it=$((80 * k)); [ $it -gt 600 ] && it=600
  lead=$(python3 -c "print(1.5 + 0.25 * $k)"); secs=$(python3 -c "print($lead + $OFFWIN + 2)")
  offcpu "off_c_free_walk_k$k" "$lead" env TCP_YARDSTICK_FREE="$secs" TCP_YARDSTICK_WALK=1 "$O/yard" $((256 << 20)) 1 "$k" 1 0
  offcpu "off_tool_w32_k$k" 2.5 timeout 60 "$B/bin/tcpx-run" bench --role local --no-csv --json --verify off --channels 1 --socks-per-channel "$k" --size 256M --chunk 8M --window 32 --iters "$it" --warmup 2
done
# Extra tool runs at 16 sockets, window 32 (EXP=1): one transfer of 4 GiB per iteration against
# 256 MiB ones, and a thread per socket.
if [ "${EXP:-0}" = 1 ]; then
  T="$B/bin/tcpx-run bench --role local --no-csv --json --verify off --channels 1 --socks-per-channel 16 --chunk 8M --window 32 --warmup 1"
  prof exp_256M_k16 2.5 timeout 60 $T --size 256M --iters 600
  prof exp_4G_k16 6 timeout 60 $T --size 4G --iters 60
  TCPX_SOCKET_THREADS=16 prof exp_256M_t16_k16 2.5 timeout 60 $T --size 256M --iters 600
  offcpu off_exp_4G_k16 6 timeout 60 $T --size 4G --iters 40
fi
# The device tool brings back few files: one tarball of everything, and the summaries beside it.
tar -C "$O" -czf /tmp/prof.tgz --exclude yard . && rm -rf "$O"/* && mv /tmp/prof.tgz "$O/prof.tgz"
