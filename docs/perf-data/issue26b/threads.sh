#!/usr/bin/env bash
# CPU by thread group (send, receive, rest) of the yardstick and the tool at 8 and 16 streams.
set -u
B="$(cd "$(dirname "$0")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"; J="$O/threads.jsonl"; : > "$J"
gcc -O2 -pthread -o "$O/yard" "$B/tcp_yardstick.c"
for rep in 1 2 3; do for k in 8 16; do
  r=$(TCP_YARDSTICK_FREE=1.5 python3 "$B/threads.py" "$O/yard" $((256<<20)) 1 "$k" 1 0)
  echo "{\"rep\":$rep,\"what\":\"c_free\",\"streams\":$k,\"line\":$(echo "$r" | head -1),\"threads\":$(echo "$r" | tail -1)}" >> "$J"
  for w in 32; do
    r=$(python3 "$B/threads.py" "$B/tcpx-run" bench --role local --no-csv --json --verify off --channels 1 --socks-per-channel "$k" --size 256M --chunk 4M --window $w --iters 60 --warmup 2 2>/dev/null)
    echo "{\"rep\":$rep,\"what\":\"w$w\",\"streams\":$k,\"line\":$(echo "$r" | head -1),\"threads\":$(echo "$r" | tail -1)}" >> "$J"
  done
done; done
python3 - "$J" <<'PY'
import json, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| run | K | GB/s | send threads CPU-s/GB (sys) | recv threads CPU-s/GB (sys) | rest CPU-s/GB |")
print("|---|---:|---:|---:|---:|---:|")
for w in ("c_free", "w32"):
    for k in (8, 16):
        v = [r for r in rows if r["what"] == w and r["streams"] == k]
        def gb(r):
            l = r["line"]
            return l["bytes"] / 1e9 if "bytes" in l else 268435456 * 62 / 1e9
        def g(r):
            l = r["line"]
            return l["gbps"] if "gbps" in l else l["measurements"][0]["recv"]["algbw_gbs"]
        per = lambda grp, f: st.median([(r["threads"][grp]["user_s"] + r["threads"][grp]["sys_s"]) / gb(r) if f == "all" else r["threads"][grp]["sys_s"] / gb(r) for r in v])
        print("| %s | %d | %.2f | %.3f (%.3f) | %.3f (%.3f) | %.3f |" % (w, k, st.median([g(r) for r in v]), per("send", "all"), per("send", "sys"), per("recv", "all"), per("recv", "sys"), per("other", "all")))
PY
