#!/usr/bin/env bash
# Issue 40 on one GPU machine, in one call (1-6 minutes on one H200 with 16 cores, by part): the auto
# chunk and window against free-running plain C TCP, the 16-socket host path's candidate changes,
# and GPU staging at 16 sockets.
#
#   bash docs/perf-data/issue40-gpu.sh            # every part: host variants gpu
#   PARTS="host" bash docs/perf-data/issue40-gpu.sh
#
# Expects, in the ignored folder .device-bundle/issue40/ (carried): bin/tcpx-run (release build,
# --no-default-features, stripped; or bin/tcpx-run.xz) and bin/tcp_yardstick (xtask/src/
# tcp_yardstick.c built static), optionally perf/ (Debian's linux-perf unpacked, with perf/lib/
# holding its libraries and loader; or perf.tar.xz of that folder). Parts, each interleaved over REPS repetitions (default 3):
#   host      free-running C (TCP_YARDSTICK_FREE), walking C, walking C through a 256 KiB bounce
#             with streaming stores ("fill": the fastest plain C that fills its buffer), timed C
#             doing the bench's own transfer through a 128 KiB bounce, and `tcpx-run bench` with
#             no chunk or window flags at K = 1, 4, 8, 16 sockets (one channel), host memory,
#             256 MiB, --verify off (and bin/tcpx-run-old the same way, if carried);
#             HOST_EXTRA: NAME=FLAG:VALUE,... entries run beside it (an item TCPX_VAR:VALUE
#             sets that environment variable instead); HOST_FREE_ONLY=1: free C only
#   sizes     with bin/tcpx-run-old: this build against it at SIZES_MIB (16 32 64) MiB and
#             SIZES_KS (4 16) sockets
#   variants  at K = VK (default 16): free-running C, walking C, walking C whose reads land in a
#             small buffer copied on (plainly, or with streaming stores), and the tool with no
#             flags (the session-12 call 1 build also had TCPX_EXPERIMENT_RECV_BOUNCE=BYTES to
#             force that path, since folded into the backend as its rule for large buffers)
#   barrier   at K = VK: a barrier per iteration (default) against --barrier size
#   threads   at K = VK: worker threads per side THREADS (4 12 16) against the build's own count
#             (a build with TCPX_EXPERIMENT_THREADS)
#   envs      at K = VK: the tool under each of TOOL_ENVS' experiment switches (NAME=VAR:VALUE,...;
#             only a device build made for it reads them) against free-running C, walking C
#             through a streaming-store bounce, and timed C doing the bench's own transfer
#   gpu       GPU 0 -> GPU 0 staging, 1 x 16 sockets, 256 MiB, verified: no flags against
#             chunk 4M/8M/16M x window 16/32 and staging rings of 32M and 128M (GPU_ONLY_AUTO=1:
#             no flags only, and the previous build; GPU_EXTRA: space-separated NAME=FLAG:VALUE,...
#             entries run beside it; GPU_ITERS: timed iterations, default 40), and free-running C
#             at 16 streams in each repetition
#   perf      cpu-clock profiles (perf record -a) of the C yardstick and the tool at K = 16, if
#             perf runs (PERF_GPU=1: GPU staging too); top symbols and threads per run
# Every run is one JSON line in $OUT/issue40.jsonl ({"part","name","k","rep","gbs",...}, the
# tool's lines with its system calls per side); the summary table (median [min-max], ratio to
# the C yardstick of the same repetition) is printed at the end and kept in $OUT/summary.txt.
set -uo pipefail
B=$(realpath .device-bundle/issue40)
OUT=${OUT:-/tmp/issue40/out}; mkdir -p "$OUT"
W=/tmp/issue40; mkdir -p "$W"
J="$OUT/issue40.jsonl"; : > "$J"
L="$OUT/issue40.log"; : > "$L"
REPS=${REPS:-3}
PARTS=" ${PARTS:-host sizes variants gpu perf} "
has() { case "$PARTS" in *" $1 "*) return 0;; esac; return 1; }
for f in "$B"/bin/*.xz; do [ -f "$f" ] && xz -dkf "$f"; done
[ -f "$B/perf.tar.xz" ] && [ ! -x "$B/perf/perf" ] && tar -C "$B" -xJf "$B/perf.tar.xz"
chmod +x "$B"/bin/* 2>/dev/null
TOOL="$B/bin/tcpx-run"; YARD="$B/bin/tcp_yardstick"
# A previous build to hold the new one against in the same call (runs named old*), if carried.
OLD="$B/bin/tcpx-run-old"
if [ ! -x "$YARD" ] && command -v gcc > /dev/null; then
  gcc -O2 -pthread -o "$W/tcp_yardstick" xtask/src/tcp_yardstick.c && YARD="$W/tcp_yardstick"
fi
{ nvidia-smi -L 2>&1; echo "cpus $(nproc)"; grep -m1 'model name' /proc/cpuinfo; uname -r
  cat /proc/loadavg; date -u; "$TOOL" --version 2>&1 | head -n 1
  for f in /proc/sys/net/core/busy_read /proc/sys/net/core/busy_poll /proc/sys/net/ipv4/tcp_rmem \
    /proc/sys/net/ipv4/tcp_wmem /proc/sys/kernel/perf_event_paranoid; do echo "$f: $(cat $f 2>&1)"; done
  for d in /sys/devices/system/cpu/cpu0/cache/index*; do
    echo "cache $(cat $d/level) $(cat $d/type) $(cat $d/size) shared by cpus $(cat $d/shared_cpu_list)"; done
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
# KS, VK (the variants' socket count), MIB: smaller values for a trial run off the GPU machine.
KS=${KS:-1 4 8 16}; VK=${VK:-16}; MIB=${MIB:-256}
M=$((MIB << 20))

# One free-running C run: K streams, each its own 256 MiB buffers, SECS seconds. NAME is c_free
# unless given; further arguments are environment assignments (TCP_YARDSTICK_WALK=1, ...).
yard() { local part=$1 k=$2 rep=$3 name=${4:-c_free}; shift 3; [ $# -gt 0 ] && shift
  local secs line
  secs=$(python3 -c "print(2.0 + 0.05 * $k)")
  line=$(env "$@" TCP_YARDSTICK_FREE=$secs timeout 60 "$YARD" $M 1 "$k" 1 0 2>> "$L" | tail -n 1)
  [ -n "$line" ] || { echo "yardstick $name K=$k failed (see issue40.log)" | tee -a "$L"; return; }
  python3 - "$part" "$k" "$rep" "$line" "$name" >> "$J" <<'PY'
import json, sys
part, k, rep, line, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
d = json.loads(line)
out = {"part": part, "name": name, "k": k, "rep": rep, "gbs": d["gbps"],
       "user_s": d["user_s"], "sys_s": d["sys_s"], "csw": d["csw"],
       "tx_calls": d.get("tx_calls"), "rx_calls": d.get("rx_calls"),
       "tx_bytes_per_call": d["bytes"] / d["tx_calls"] if d.get("tx_calls") else None,
       "rx_bytes_per_call": d["bytes"] / d["rx_calls"] if d.get("rx_calls") else None}
print(json.dumps(out))
PY
  tail -n 1 "$J"
}

# One timed C run (the bench's transfer: one SIZE message in K slices, ITERS times, 1 MiB writes):
# PART, K, REP, NAME, then environment assignments (TCP_YARDSTICK_SYNC=1, ...).
ytimed() { local part=$1 k=$2 rep=$3 name=$4; shift 4
  local iters=$((20 * k)) line; [ $iters -gt 240 ] && iters=240
  line=$(env "$@" timeout 60 "$YARD" $M $iters "$k" 1 2>> "$L" | tail -n 1)
  [ -n "$line" ] || { echo "yardstick $name K=$k failed (see issue40.log)" | tee -a "$L"; return; }
  python3 -c 'import json,sys; d=json.loads(sys.argv[5]); print(json.dumps({"part":sys.argv[1],"name":sys.argv[4],"k":int(sys.argv[2]),"rep":int(sys.argv[3]),"gbs":d["gbps"],"user_s":d["user_s"],"sys_s":d["sys_s"],"csw":d["csw"],"tx_calls":d["tx_calls"],"rx_calls":d["rx_calls"]}))' "$part" "$k" "$rep" "$name" "$line" >> "$J"
  tail -n 1 "$J"
}

# An EXTRA entry's arguments: "--flag:VALUE,TCPX_VAR:VALUE" -> --flag VALUE TCPX_VAR=VALUE.
extra_args() { local a; for a in $(echo "$1" | tr ',' ' '); do
  case "$a" in TCPX_*) echo "${a/:/=}";; *) echo "${a%%:*}"; [ "$a" != "${a#*:}" ] && echo "${a#*:}";; esac
done; }

# One tool run: NAME, K, REP, then env assignments (VAR=VALUE) and extra flags.
tool() { local part=$1 name=$2 k=$3 rep=$4; shift 4
  local envs=() flags=()
  for a in "$@"; do case "$a" in TCPX_*=*) envs+=("$a");; *) flags+=("$a");; esac; done
  local iters=$((20 * k)); [ $iters -gt 240 ] && iters=240
  local mem=(--verify off)
  [ "$part" = gpu ] && { iters=${GPU_ITERS:-40}; mem=(--memory cuda); }
  local bin=$TOOL; case "$name" in old*) bin=$OLD;; esac
  env "${envs[@]}" timeout 120 "$bin" bench --role local --no-csv --json --channels 1 \
    --socks-per-channel "$k" --size "${MIB}M" --iters "$iters" --warmup 3 "${mem[@]}" "${flags[@]}" \
    > "$W/run.json" 2> "$W/run.err"
  local rc=$?
  grep -E '^# (256M|transport)|calls:' "$W/run.err" | sed "s/^/  [$name k$k r$rep] /" >> "$L"
  python3 - "$part" "$name" "$k" "$rep" "$rc" "$W/run.json" "$W/run.err" "${envs[*]:-}" "${flags[*]:-}" >> "$J" <<'PY'
import json, sys
part, name, k, rep, rc, path, err, envs, flags = sys.argv[1:10]
out = {"part": part, "name": name, "k": int(k), "rep": int(rep), "env": envs, "flags": flags}
try:
    d = json.load(open(path))
    m = d["measurements"][-1]
    out["gbs"] = m["recv"]["algbw_gbs"]
    out["chosen"] = d["start"].get("transfer", [{}])[-1].get("chosen")
    out["wrong"] = m["recv"].get("wrong_bytes")
    for side in ("send", "recv"):
        c = m[side].get("socket_calls")
        if c:
            out[side + "_calls"] = c["calls"]
            out[side + "_bytes_per_call"] = round(c["bytes_per_call"])
            out[side + "_blocked"] = c["blocked_calls"]
            out[side + "_waits"] = c["waits"]
            out[side + "_bytes_per_wait"] = round(c["bytes_per_wait"])
            out[side + "_worker_cpus"] = c.get("worker_cpus")
except Exception as e:
    out["error"] = "rc %s: %s; %s" % (rc, e, open(err).read()[-400:].replace("\n", " | "))
print(json.dumps(out))
PY
  tail -n 1 "$J"
}

t0=$(date +%s)
if has host; then
  for rep in $(seq 1 "$REPS"); do
    for k in $KS; do
      yard host "$k" "$rep"
      if [ -z "${HOST_FREE_ONLY:-}" ]; then
        yard host "$k" "$rep" c_walk TCP_YARDSTICK_WALK=1
        yard host "$k" "$rep" c_walk_bounce256k_nt TCP_YARDSTICK_BOUNCE=262144 TCP_YARDSTICK_NT=1
        ytimed host "$k" "$rep" c_sync_bounce128k_nt TCP_YARDSTICK_SYNC=1 TCP_YARDSTICK_BOUNCE=131072 TCP_YARDSTICK_NT=1
      fi
      tool host auto "$k" "$rep"
      for e in ${HOST_EXTRA:-}; do
        tool host "${e%%=*}" "$k" "$rep" $(extra_args "${e#*=}")
      done
      [ -x "$OLD" ] && tool host old_auto "$k" "$rep"
    done
  done
  echo "== host: $(( $(date +%s) - t0 )) s"
fi
if has sizes && [ -x "$OLD" ]; then
  # Around the receive-around-cache threshold (twice the last-level cache): this build against
  # the previous, at SIZES_KS sockets and SIZES_MIB MiB.
  for rep in $(seq 1 "$REPS"); do
    for k in ${SIZES_KS:-4 16}; do for mib in ${SIZES_MIB:-16 32 64}; do
      MIB=$mib tool sizes "auto_${mib}m" "$k" "$rep"
      MIB=$mib tool sizes "old_auto_${mib}m" "$k" "$rep"
    done; done
  done
  echo "== sizes: $(( $(date +%s) - t0 )) s"
fi
if has variants; then
  # Receiving into a small cache-resident buffer and copying on with streaming stores, in plain C,
  # against the tool (which does so for large buffers) at VK sockets.
  for rep in $(seq 1 "$REPS"); do
    for k in $VK; do
      yard variants "$k" "$rep"
      yard variants "$k" "$rep" c_walk TCP_YARDSTICK_WALK=1
      yard variants "$k" "$rep" c_walk_bounce256k TCP_YARDSTICK_BOUNCE=262144
      yard variants "$k" "$rep" c_walk_bounce256k_nt TCP_YARDSTICK_BOUNCE=262144 TCP_YARDSTICK_NT=1
      yard variants "$k" "$rep" c_walk_bounce1m_nt TCP_YARDSTICK_BOUNCE=1048576 TCP_YARDSTICK_NT=1
      tool variants auto "$k" "$rep"
      [ -x "$OLD" ] && tool variants old_auto "$k" "$rep"
    done
  done
  echo "== variants: $(( $(date +%s) - t0 )) s"
fi
if has barrier; then
  # Timing: a barrier per iteration (the default) against back to back (--barrier size, as
  # nccl-tests times; free-running C has no barrier at all), at VK sockets.
  for rep in $(seq 1 "$REPS"); do
    for k in $VK; do
      yard barrier "$k" "$rep"
      tool barrier auto "$k" "$rep"
      tool barrier back_to_back "$k" "$rep" --barrier size
    done
  done
  echo "== barrier: $(( $(date +%s) - t0 )) s"
fi
if has threads; then
  # Worker threads per side at VK sockets, forced through TCPX_EXPERIMENT_THREADS (only the
  # session-12 call 6 build has it; others ignore it and run their own count).
  for rep in $(seq 1 "$REPS"); do
    for k in $VK; do
      yard threads "$k" "$rep"
      tool threads auto "$k" "$rep"
      for t in ${THREADS:-4 12 16}; do tool threads "t$t" "$k" "$rep" TCPX_EXPERIMENT_THREADS=$t; done
    done
  done
  echo "== threads: $(( $(date +%s) - t0 )) s"
fi
if has envs; then
  # The tool under experiment switches a device build reads (TOOL_ENVS: space-separated
  # NAME=VAR:VALUE[,VAR:VALUE...] entries), against free-running C, walking C through a 256 KiB
  # bounce with streaming stores, and timed C doing the bench's own transfer (one SIZE message cut
  # into K slices, a barrier after each iteration) through a 128 KiB bounce, at VK sockets.
  for rep in $(seq 1 "$REPS"); do
    for k in $VK; do
      yard envs "$k" "$rep"
      yard envs "$k" "$rep" c_walk_bounce256k_nt TCP_YARDSTICK_BOUNCE=262144 TCP_YARDSTICK_NT=1
      ytimed envs "$k" "$rep" c_sync_bounce128k_nt TCP_YARDSTICK_SYNC=1 TCP_YARDSTICK_BOUNCE=131072 TCP_YARDSTICK_NT=1
      ytimed envs "$k" "$rep" c_sync TCP_YARDSTICK_SYNC=1
      tool envs auto "$k" "$rep"
      for e in ${TOOL_ENVS:-}; do
        tool envs "${e%%=*}" "$k" "$rep" $(echo "${e#*=}" | tr ',' ' ' | tr ':' '=')
      done
    done
  done
  echo "== envs: $(( $(date +%s) - t0 )) s"
fi
if has gpu; then
  if nvidia-smi -L > /dev/null 2>&1; then
    for rep in $(seq 1 "$REPS"); do
      yard gpu 16 "$rep"
      tool gpu auto 16 "$rep"
      [ -x "$OLD" ] && tool gpu old_auto 16 "$rep"
      for e in ${GPU_EXTRA:-}; do
        tool gpu "${e%%=*}" 16 "$rep" $(extra_args "${e#*=}")
      done
      [ -n "${GPU_ONLY_AUTO:-}" ] && continue
      tool gpu ring32m 16 "$rep" --staging-ring 32M
      tool gpu ring128m 16 "$rep" --staging-ring 128M
      for c in 4M 8M 16M; do for w in 16 32; do
        tool gpu "c${c}_w$w" 16 "$rep" --chunk "$c" --window "$w"
      done; done
    done
  else
    echo "gpu: no GPU (nvidia-smi -L failed)" | tee -a "$L"
  fi
  echo "== gpu: $(( $(date +%s) - t0 )) s"
fi
if has perf && [ -x "$B/perf/perf" ]; then
  PERF() { "$B/perf/lib/ld-linux-x86-64.so.2" --library-path "$B/perf/lib" "$B/perf/perf" "$@"; }
  if PERF record -e cpu-clock -a -F 999 -o "$W/ptest.data" -- sleep 0.2 > "$OUT/perf-test.txt" 2>&1; then
    prof() { local name=$1; shift
      "$@" > /dev/null 2>> "$L" & local pid=$!
      sleep 2.5
      PERF record -q --no-buildid -e cpu-clock -a -g -F 1999 -o "$W/p.data" -- sleep 2 >> "$L" 2>&1
      wait $pid
      PERF report -i "$W/p.data" --no-children -g none --sort sym --stdio 2>> "$L" | grep -E '^ +[0-9]' | head -n 25 > "$OUT/perf-$name.txt"
      # Per thread name (the tool's workers are tcpx-send-cN-tM / tcpx-recv-cN-tM; swapper is idle).
      PERF report -i "$W/p.data" --no-children -g none --sort comm --stdio 2>> "$L" | grep -E '^ +[0-9]' | head -n 40 > "$OUT/perf-$name-threads.txt"
      PERF report -i "$W/p.data" --no-children -g none --sort comm,sym --stdio 2>> "$L" | grep -E '^ +[0-9]' | head -n 1500 > "$OUT/perf-$name-comm-sym.txt"
      echo "-- perf $name (top 10 symbols, share of samples)"; head -n 10 "$OUT/perf-$name.txt"
    }
    prof c_free_k16 env TCP_YARDSTICK_FREE=6 "$YARD" $M 1 16 1 0
    prof c_walk_k16 env TCP_YARDSTICK_FREE=6 TCP_YARDSTICK_WALK=1 "$YARD" $M 1 16 1 0
    prof c_walk_bounce_nt_k16 env TCP_YARDSTICK_FREE=6 TCP_YARDSTICK_BOUNCE=262144 TCP_YARDSTICK_NT=1 "$YARD" $M 1 16 1 0
    prof tool_auto_k16 "$TOOL" bench --role local --no-csv --verify off --channels 1 --socks-per-channel 16 --size 256M --iters 400 --warmup 2
    if [ -n "${PERF_GPU:-}" ] && nvidia-smi -L > /dev/null 2>&1; then
      prof tool_gpu_k16 "$TOOL" bench --role local --no-csv --memory cuda --channels 1 --socks-per-channel 16 --size 256M --iters 600 --warmup 2
    fi
    [ -x "$OLD" ] && prof tool_old_k16 "$OLD" bench --role local --no-csv --verify off --channels 1 --socks-per-channel 16 --size 256M --iters 400 --warmup 2
  else
    echo "perf does not run here:"; tail -n 5 "$OUT/perf-test.txt"
  fi
  echo "== perf: $(( $(date +%s) - t0 )) s"
fi

python3 - "$J" <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(v):
    return "%.2f [%.2f-%.2f]" % (statistics.median(v), min(v), max(v)) if v else "-"
yard = {(r["part"], r["k"], r["rep"]): r["gbs"] for r in rows if r["name"] == "c_free"}
yard_any = {}
for (p, k, rep), g in yard.items():
    yard_any.setdefault((k, rep), g)
groups = {}
for r in rows:
    if r["name"] == "c_free" or "gbs" not in r:
        continue
    groups.setdefault((r["part"], r["name"], r["k"]), []).append(r)
print("part      name                 K  GB/s median [min-max]   / C free per rep          sys calls/side: send KiB/call, recv KiB/call, recv KiB/wait")
for (part, name, k), rs in sorted(groups.items(), key=lambda x: (x[0][0], x[0][2], x[0][1])):
    g = [r["gbs"] for r in rs]
    ratios = []
    for r in rs:
        c = yard.get((part, k, r["rep"])) or yard_any.get((k, r["rep"]))
        if c:
            ratios.append(r["gbs"] / c)
    walks = [r["gbs"] / w for r in rs
             for w in [next((x["gbs"] for x in rows if x["name"] == "c_walk" and x["part"] == part
                             and x["k"] == k and x["rep"] == r["rep"]), None)] if w]
    if walks and name != "c_walk":
        ratios_w = " /walk " + ", ".join("%.2f" % x for x in walks)
    else:
        ratios_w = ""
    fills = [r["gbs"] / w for r in rs
             for w in [next((x["gbs"] for x in rows if x["name"] == "c_walk_bounce256k_nt"
                             and x["k"] == k and x["rep"] == r["rep"]), None)] if w]
    if fills and name != "c_walk_bounce256k_nt":
        ratios_w += " /fill " + ", ".join("%.2f" % x for x in fills)
    calls = ""
    r0 = rs[-1]
    if "send_bytes_per_call" in r0:
        calls = "%6.0f %6.0f %6.0f" % (r0["send_bytes_per_call"] / 1024, r0.get("recv_bytes_per_call", 0) / 1024, r0.get("recv_bytes_per_wait", 0) / 1024)
    print("%-9s %-20s %2d  %-22s %-25s %s%s" % (part, name, k, med(g), ", ".join("%.2f" % x for x in ratios), calls, ratios_w))
for k in sorted({k for (_, k, _) in yard}):
    v = [g for (p, kk, _), g in yard.items() if kk == k]
    c = [r for r in rows if r["name"] == "c_free" and r["k"] == k and r.get("rx_bytes_per_call")]
    per = "  C KiB/call tx %.0f rx %.0f" % (c[-1]["tx_bytes_per_call"] / 1024, c[-1]["rx_bytes_per_call"] / 1024) if c else ""
    print("C free-running     K=%2d %s%s" % (k, med(v), per))
errs = [r for r in rows if "error" in r]
for r in errs:
    print("ERROR", r["part"], r["name"], r["k"], r["rep"], r["error"][:300])
chosen = {(r["part"], r["k"]): r.get("chosen") for r in rows if r.get("name") == "auto"}
for (p, k), c in sorted(chosen.items()):
    print("auto %s K=%d: %s" % (p, k, c))
PY
echo "== total: $(( $(date +%s) - t0 )) s"
