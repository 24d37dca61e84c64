# Shared by final.sh and profile.sh (sourced, with NAME set): output files, the machine's
# description, the C yardstick's build, and the two runners (yard: free-running plain C with its
# getrusage CPU per GB; tool: tcpx-run bench with its --sample-ms CPU per GB), one JSON row each.
set -u
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"
J="$O/$NAME.jsonl"; L="$O/$NAME.log"; : > "$J"
RUN="$B/tcpx-run"; REPS="${REPS:-3}"
{ echo "machine: $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; uname -r
  for f in /proc/sys/net/ipv4/tcp_wmem /proc/sys/net/ipv4/tcp_rmem /proc/sys/net/core/wmem_max /proc/sys/net/core/rmem_max /proc/sys/net/ipv4/tcp_mem /sys/kernel/mm/transparent_hugepage/enabled; do echo "$f: $(cat $f)"; done
  lscpu | grep -E 'L2|L3|NUMA|Thread|Core'; cat /proc/loadavg; date -u; } | tee "$O/machine-$NAME.txt"
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
