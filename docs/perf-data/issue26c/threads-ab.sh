#!/usr/bin/env bash
# 16 sockets: the walking yardstick, then the tool with the default threads (8 per side on 16
# CPUs) and with a thread per socket (TCPX_SOCKET_THREADS=16), at 8 and 32 in flight; 3
# interleaved repetitions; GB/s and the tool's --sample-ms CPU per GB.
set -u
B="$(cd "$(dirname "$0")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"; J="$O/threads-ab.jsonl"; : > "$J"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gcc -O2 -pthread -o /tmp/yard "$B/tcp_yardstick.c" || exit 1
tool() { local what="$1" w="$2"
  timeout 90 "$B/bin/tcpx-run" bench --role local --no-csv --json --verify off --channels 1 --socks-per-channel 16 --size 256M --chunk 8M --window "$w" --iters 20 --warmup 2 --sample-ms 10 2>/dev/null | tail -n 1 | python3 -c '
import json,sys; r=json.load(sys.stdin)["measurements"][0]["recv"]; c=r.get("cpu") or {}
print(json.dumps({"rep":'"$rep"',"what":"'"$what"'","gbps":r["algbw_gbs"],"cpu_s_per_gb":c.get("cpu_s_per_gb")}))' >> "$J"; }
for rep in 1 2 3; do
  TCP_YARDSTICK_WALK=1 TCP_YARDSTICK_FREE=2 timeout 60 /tmp/yard $((256 << 20)) 1 16 1 0 | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free_walk\",/" >> "$J"
  tool t8_w32 32; TCPX_SOCKET_THREADS=16 tool t16_w32 32
  tool t8_w8 8; TCPX_SOCKET_THREADS=16 tool t16_w8 8
done
python3 - "$J" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["what"], r["rep"]): r for r in rows}
for w in ("c_free_walk", "t8_w32", "t16_w32", "t8_w8", "t16_w8"):
    v = [by[(w, p)] for p in (1, 2, 3) if (w, p) in by]
    q = [by[(w, p)]["gbps"] / by[("c_free_walk", p)]["gbps"] for p in (1, 2, 3) if (w, p) in by and ("c_free_walk", p) in by]
    print(w, "GB/s", " ".join("%.2f" % r["gbps"] for r in v), "/ walking", " ".join("%.2f" % x for x in q),
          "CPU-s/GB", " ".join("%.3f" % (r.get("cpu_s_per_gb") or 0) for r in v))
PY
