#!/usr/bin/env bash
# Writes ratios.sh and ratios.py into DIR: the GPU bundle's ratio part (RUN_SH_RATIOS and
# RATIOS_PY of xtask/src/gpu_test.rs, what `cargo xtask gpu-test` puts in run.sh) behind a minimal
# head, so the ratio run goes to the device without the bundle's test executables.
# usage: make-ratios.sh REPO DIR   (DIR also needs bin/tcpx-run, lib/ and tcp_yardstick.c)
set -eu
python3 - "$1/xtask/src/gpu_test.rs" "$2" <<'PY'
import sys
s = open(sys.argv[1]).read()
def const(name):
    i = s.index('const %s: &str = r#"' % name) + len('const %s: &str = r#"' % name)
    return s[i:s.index('"#;', i)]
head = '''#!/usr/bin/env bash
set -u
B="$(cd "$(dirname "$0")" && pwd)"; O="${OUT:-$B/out}"; mkdir -p "$O"; : > "$O/bench.log"; : > "$O/results.jsonl"; : > "$O/ratios.jsonl"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU '); if [ "$NGPU" -ge 2 ]; then DST=1; else DST=0; fi
PARTS=" ratios "; has_part() { case "$PARTS" in *" $1 "*) return 0;; esac; return 1; }
declare -a SKIPS; skip_bench() { SKIPS+=("benchmark $1: $2"); echo "SKIP: benchmark $1: $2" | tee -a "$O/bench.log"; }
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv; lscpu | grep -E '^(Model name|CPU\\(s\\))'; uname -r; cat /proc/loadavg; date -u; } > "$O/ratio-machine.txt" 2>&1
'''
open(sys.argv[2] + "/ratios.sh", "w").write(head + const("RUN_SH_RATIOS") + 'date -u >> "$O/ratio-machine.txt"\n')
open(sys.argv[2] + "/ratios.py", "w").write(const("RATIOS_PY"))
PY
