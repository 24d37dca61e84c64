#!/usr/bin/env bash
# Where the 16-socket gap goes: CPU per byte of the free-running yardstick (getrusage over its
# timed part) against the tool's (--sample-ms: process CPU over the timed iterations), with
# socket buffer sizes, call sizes and a misaligning prefix varied; interleaved repetitions.
set -u
B="$(cd "$(dirname "$0")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"
J="$O/profile.jsonl"; L="$O/profile.log"; : > "$J"
RUN="$B/tcpx-run"; REPS="${REPS:-3}"
{ echo "machine: $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; uname -r
  for f in /proc/sys/net/ipv4/tcp_wmem /proc/sys/net/ipv4/tcp_rmem /proc/sys/net/core/wmem_max /proc/sys/net/core/rmem_max /proc/sys/net/ipv4/tcp_mem /sys/kernel/mm/transparent_hugepage/enabled; do echo "$f: $(cat $f)"; done
  lscpu | grep -E 'L2|L3|NUMA|Thread|Core'; cat /proc/loadavg; date -u; } | tee "$O/machine-profile.txt"
gcc -O2 -pthread -o "$O/yard" "$B/tcp_yardstick.c" 2>>"$L"; Y="$O/yard"
yard() { local what="$1" k="$2"; shift 2
  env "$@" TCP_YARDSTICK_FREE=1.5 timeout 60 "$Y" $((256<<20)) 1 "$k" 1 "${CALL:-0}" 2>>"$L" | python3 -c '
import json,sys
d=json.loads(sys.stdin.read()); gb=d["bytes"]/1e9
print(json.dumps({"rep":'"$rep"',"what":"'"$what"'","streams":'"$k"',"gbps":d["gbps"],"cpu_s_per_gb":(d["user_s"]+d["sys_s"])/gb,"sys_share":d["sys_s"]/max(d["user_s"]+d["sys_s"],1e-9),"csw_per_gb":d["csw"]/gb,"busy_cpus":(d["user_s"]+d["sys_s"])/d["secs"]}))' >> "$J" 2>>"$L"; }
tool() { local what="$1" k="$2" w="$3"; shift 3
  local mem=host iters=20
  [ "${GPU:-0}" = 1 ] && mem=cuda:0,0 && iters=10
  timeout 120 "$RUN" bench --role local --no-csv --json --verify "${VERIFY:-off}" --memory "$mem" --channels 1 --socks-per-channel "$k" \
    --size 256M --chunk "${CHUNK:-4M}" --window "$w" --iters "$iters" --warmup 2 --sample-ms 10 "$@" 2>>"$L" | tail -n 1 | python3 -c '
import json,sys
r=json.loads(sys.stdin.read())["measurements"][0]["recv"]; c=r.get("cpu") or {}
print(json.dumps({"rep":'"$rep"',"what":"'"$what"'","streams":'"$k"',"gbps":r["algbw_gbs"],"wrong":r.get("wrong_bytes"),"cpu_s_per_gb":c.get("cpu_s_per_gb"),"busy_pct":c.get("busy_pct"),"busy_cpus":(c.get("cpu_s_per_gb") or 0)*r["algbw_gbs"]}))' >> "$J" 2>>"$L"; }
for rep in $(seq 1 "$REPS"); do
  for k in 8 16; do
    yard c_free "$k"
    yard c_free_buf1M "$k" TCP_YARDSTICK_BUF=1048576
    yard c_free_skew52 "$k" TCP_YARDSTICK_SKEW=52
    CALL=2097152 yard c_free_call2M "$k"
    tool w32 "$k" 32
    tool w32_buf512K "$k" 32 --sock-buf 512K
    tool w32_buf1M "$k" 32 --sock-buf 1M
    tool w32_buf2M "$k" 32 --sock-buf 2M
    tool w8_buf1M "$k" 8 --sock-buf 1M
    tool w8 "$k" 8
    if [ "$k" = 16 ]; then
      GPU=1 VERIFY=on CHUNK=8M tool gpu_w32 16 32
      GPU=1 VERIFY=on CHUNK=8M tool gpu_w32_buf1M 16 32 --sock-buf 1M
    fi
  done
  echo "rep $rep $(date -u +%T) $(cat /proc/loadavg)" >> "$L"
done
python3 - "$J" <<'PY' | tee "$O/profile.md"
import json, sys, statistics as st
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by={(r["what"],r["streams"],r["rep"]):r for r in rows}
reps=sorted({r["rep"] for r in rows}); keys=[]
for r in rows:
    if (r["what"],r["streams"]) not in keys: keys.append((r["what"],r["streams"]))
print("| run | K | GB/s median [min-max] | / c_free median [min-max] | CPU-s per GB | CPUs busy (CPU-s/GB x GB/s) | ctxt sw per GB (C) |")
print("|---|---:|---:|---:|---:|---:|---:|")
med=lambda v: "%.3f"%st.median(v) if v else "-"
for w,k in sorted(keys,key=lambda x:(x[1],not x[0].startswith("c_"),x[0])):
    v=[by[(w,k,p)] for p in reps if (w,k,p) in by]
    g=[r["gbps"] for r in v]
    q=[by[(w,k,p)]["gbps"]/by[("c_free",k,p)]["gbps"] for p in reps if (w,k,p) in by and ("c_free",k,p) in by]
    print("| %s | %d | %.2f [%.2f-%.2f] | %s | %s | %s | %s |"%(w,k,st.median(g),min(g),max(g),
      "%.2f [%.2f-%.2f]"%(st.median(q),min(q),max(q)) if q and w!="c_free" else "-",
      med([r["cpu_s_per_gb"] for r in v if r.get("cpu_s_per_gb")]), med([r["busy_cpus"] for r in v if r.get("busy_cpus")]),
      med([r["csw_per_gb"] for r in v if "csw_per_gb" in r])))
print("GPU wrong bytes:", sorted({str(r.get("wrong")) for r in rows if r["what"].startswith("gpu")}))
PY
