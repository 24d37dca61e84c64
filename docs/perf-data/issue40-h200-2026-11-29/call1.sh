#!/usr/bin/env bash
# One device call: issue 41 (plugin build + watch shim under torch) then issue 40 (host, gpu, variants).
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT/i41" "$OUT/i40host" "$OUT/i40gpu" "$OUT/i40var"
echo "== start $(date -u)"; nvidia-smi -L; nproc
timeout 150 bash docs/perf-data/issue41-gpu.sh build > "$OUT/i41/build.txt" 2>&1; echo "== i41 build rc=$? at $(el) s"; tail -n 3 "$OUT/i41/build.txt"
REPS=2 OUT="$OUT/i41" timeout 170 bash docs/perf-data/issue41-gpu.sh run > "$OUT/i41/run.txt" 2>&1; echo "== i41 run rc=$? at $(el) s"
grep -E '"measure": ?"(summary|verdict)"|== ' "$OUT/i41/run.txt" | tail -n 8
PARTS=host REPS=3 OUT="$OUT/i40host" timeout 130 bash docs/perf-data/issue40-gpu.sh > "$OUT/i40host/run.txt" 2>&1; echo "== i40 host rc=$? at $(el) s"
tail -n 12 "$OUT/i40host/summary.txt" 2>/dev/null
left=$(( 575 - $(el) ))
[ $left -gt 60 ] && { PARTS=gpu REPS=2 OUT="$OUT/i40gpu" timeout $(( left > 110 ? 110 : left - 5 )) bash docs/perf-data/issue40-gpu.sh > "$OUT/i40gpu/run.txt" 2>&1; echo "== i40 gpu rc=$? at $(el) s"; tail -n 10 "$OUT/i40gpu/summary.txt" 2>/dev/null; }
left=$(( 580 - $(el) ))
[ $left -gt 40 ] && { PARTS=variants REPS=1 OUT="$OUT/i40var" timeout $(( left - 5 )) bash docs/perf-data/issue40-gpu.sh > "$OUT/i40var/run.txt" 2>&1; echo "== i40 variants rc=$? at $(el) s"; tail -n 14 "$OUT/i40var/summary.txt" 2>/dev/null; }
echo "== end at $(el) s"
