#!/usr/bin/env bash
# Second device call: issue 40 host path against free-running C and walking C (same buffers),
# interleaved, 3 repetitions; issue 41's 1M overhead with more repetitions.
set -u
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
B=$(realpath .device-bundle/issue40); for f in "$B"/bin/*.xz; do xz -dkf "$f"; done; chmod +x "$B"/bin/*
TOOL="$B/bin/tcpx-run"; YARD="$B/bin/tcp_yardstick"; M=$((256 << 20))
J="$OUT/i40.jsonl"; : > "$J"; L="$OUT/i40.log"
{ nvidia-smi -L; nproc; uname -r; cat /proc/loadavg; date -u; } > "$OUT/machine.txt" 2>&1
yard() { local name=$1 k=$2 rep=$3; shift 3
  local line; line=$(env "$@" TCP_YARDSTICK_FREE=$(python3 -c "print(2.0+0.05*$k)") timeout 60 "$YARD" $M 1 "$k" 1 0 2>>"$L" | tail -n 1)
  python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({'name':sys.argv[2],'k':int(sys.argv[3]),'rep':int(sys.argv[4]),'gbs':d['gbps'],'rx_calls':d.get('rx_calls'),'sys_s':d.get('sys_s')}))" "$line" "$name" "$k" "$rep" >> "$J" 2>>"$L"
}
tool() { local name=$1 k=$2 rep=$3; shift 3
  local it=$((20 * k)); [ $it -gt 240 ] && it=240
  timeout 120 "$TOOL" bench --role local --no-csv --json --channels 1 --socks-per-channel "$k" --size 256M --iters $it --warmup 3 --verify off "$@" > /tmp/r.json 2>>"$L"
  python3 -c "import json,sys; d=json.load(open('/tmp/r.json')); m=d['measurements'][-1]; print(json.dumps({'name':sys.argv[1],'k':int(sys.argv[2]),'rep':int(sys.argv[3]),'gbs':m['recv']['algbw_gbs'],'chosen':d['start'].get('transfer',[{}])[-1].get('chosen')}))" "$name" "$k" "$rep" >> "$J" 2>>"$L"
}
for rep in 1 2 3; do
  for k in 1 4 8 16; do
    yard c_free $k $rep; yard c_walk $k $rep TCP_YARDSTICK_WALK=1; tool auto $k $rep
    [ $k -ge 8 ] && { tool c8m_w32 $k $rep --chunk 8M --window 32; tool c4m_w64 $k $rep --chunk 4M --window 64; }
    [ $k -eq 4 ] && tool c4m_w32 $k $rep --chunk 4M --window 32
  done
done
echo "== i40 at $(el) s"
python3 - "$J" <<'PY' | tee "$OUT/i40-summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows: by.setdefault((r["k"], r["rep"]), {})[r["name"]] = r["gbs"]
names = sorted({r["name"] for r in rows})
for k in sorted({r["k"] for r in rows}):
    for n in names:
        v = [by[(k, rep)][n] for rep in (1, 2, 3) if n in by.get((k, rep), {})]
        if not v: continue
        rf = [by[(k, rep)][n] / by[(k, rep)]["c_free"] for rep in (1, 2, 3) if n in by.get((k, rep), {}) and "c_free" in by[(k, rep)]]
        rw = [by[(k, rep)][n] / by[(k, rep)]["c_walk"] for rep in (1, 2, 3) if n in by.get((k, rep), {}) and "c_walk" in by[(k, rep)]]
        print("K=%2d %-8s %6.2f [%.2f-%.2f]  /free %s  /walk %s" % (k, n, statistics.median(v), min(v), max(v), " ".join("%.2f" % x for x in rf), " ".join("%.2f" % x for x in rw)))
PY
left=$(( 560 - $(el) ))
if [ $left -gt 60 ]; then
  B2=$(realpath .device-bundle/tune); so=/tmp/issue41/so/libnccl-net.so
  if [ ! -f "$so" ]; then (cd "$B2" && CUDA_ARCHS=90 QUIET=1 bash "$OLDPWD/ci/real-tcpx/build.sh" plugin-src nccl-tree deps /tmp/issue41/so) > "$OUT/build41.log" 2>&1; fi
  for f in "$B2"/bin/*.xz; do xz -dkf "$f"; done; chmod +x "$B2"/bin/*
  DEPS_LIB="$B2/deps/usr/lib/x86_64-linux-gnu" REPS=5 ITERS="1M=400" timeout $((left - 10)) \
    bash .device-bundle/watch-1m.sh "$so" .device-bundle/watch/libtcpx_watch_plugin.so "$B2/bin" /tmp/w1m > "$OUT/w1m.txt" 2>&1
  echo "== i41 1M rc=$? at $(el) s"; grep -E '"measure": ?"(summary|verdict)"' "$OUT/w1m.txt"
  tar -czf "$OUT/w1m.tgz" -C /tmp w1m 2>/dev/null
fi
tar -czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null
echo "== end at $(el) s"
