#!/usr/bin/env bash
# 16 sockets: binary A (bin/tcpx-run: 8 threads per side on 16 CPUs) against binary B
# (bin/tcpx-run-recvtps: receive comms a thread per socket, sends still 8), with the walking
# yardstick first in every repetition; 32 and 8 in flight, GPU 0 -> 0 staging at 256 MiB.
set -u
B="$(cd "$(dirname "$0")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"; J="$O/recv-ab.jsonl"; : > "$J"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
gcc -O2 -pthread -o /tmp/yard "$B/tcp_yardstick.c" || exit 1
tool() { local what="$1" bin="$2" w="$3" mem="$4" iters="$5" verify="$6"
  timeout 90 "$B/bin/$bin" bench --role local --no-csv --json --verify "$verify" --memory "$mem" --channels 1 --socks-per-channel 16 --size 256M --chunk 8M --window "$w" --iters "$iters" --warmup 2 --sample-ms 10 2>/dev/null | tail -n 1 | python3 -c '
import json,sys; r=json.load(sys.stdin)["measurements"][0]["recv"]; c=r.get("cpu") or {}
print(json.dumps({"rep":'"$rep"',"what":"'"$what"'","gbps":r["algbw_gbs"],"cpu_s_per_gb":c.get("cpu_s_per_gb"),"wrong":r.get("wrong_bytes")}))' >> "$J"; }
for rep in 1 2 3 4; do
  TCP_YARDSTICK_WALK=1 TCP_YARDSTICK_FREE=2 timeout 60 /tmp/yard $((256 << 20)) 1 16 1 0 | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free_walk\",/" >> "$J"
  tool A_w32 tcpx-run 32 host 20 off; tool B_w32 tcpx-run-recvtps 32 host 20 off
  tool A_w8 tcpx-run 8 host 20 off; tool B_w8 tcpx-run-recvtps 8 host 20 off
  tool A_gpu tcpx-run 8 cuda:0,0 5 on; tool B_gpu tcpx-run-recvtps 8 cuda:0,0 5 on
done
python3 - "$J" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["what"], r["rep"]): r for r in rows}
reps = sorted({r["rep"] for r in rows})
for w in ("c_free_walk", "A_w32", "B_w32", "A_w8", "B_w8", "A_gpu", "B_gpu"):
    v = [by[(w, p)] for p in reps if (w, p) in by]
    q = [by[(w, p)]["gbps"] / by[("c_free_walk", p)]["gbps"] for p in reps if (w, p) in by and ("c_free_walk", p) in by]
    print(w, "GB/s", " ".join("%.2f" % r["gbps"] for r in v), "| / walking", " ".join("%.2f" % x for x in q),
          "median %.2f" % st.median(q) if q else "", "| CPU-s/GB", " ".join("%.3f" % (r.get("cpu_s_per_gb") or 0) for r in v),
          "| wrong", sorted({str(r.get("wrong")) for r in v}))
PY
