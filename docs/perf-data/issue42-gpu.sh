#!/usr/bin/env bash
# The GPU-machine calls behind docs/PERFORMANCE.md's "Tuning" figures (issue 42), one part per
# call: `nccl` (tune NCCL NET/Socket, then validate), `tcpx` (build Google's plugin, tune NCCL
# over it, then validate), `socket` (the socket backend's tune against the full grid).
#
#   bash docs/perf-data/issue42-gpu.sh PART...
#
# Expects, in the ignored folder .device-bundle/tune/ (carried): bin/tcpx-run and
# bin/tcpx-rxdm-standin (release builds, optionally .xz), and for `tcpx` plugin-src/ (a checkout
# of google/nccl-plugin-gpudirecttcpx), nccl-tree/ (NCCL 2.22.3's headers: build.sh's NCCL_TREE)
# and deps/ (ci/real-tcpx/deps.sh's prefix). Each part leaves $OUT/<part>.tgz (everything it
# wrote) and prints its summary. Environment: MINUTES, POINTS (tune budget), as tune-onegpu.sh.
set -uo pipefail
B=$(realpath .device-bundle/tune)
O=/tmp/issue42; mkdir -p "$O"
OUT=${OUT:-$O/out}; mkdir -p "$OUT"
for f in "$B"/bin/*.xz; do [ -f "$f" ] && xz -dkf "$f"; done
chmod +x "$B"/bin/* 2>/dev/null
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
  f=$(find /usr/local/lib /usr/lib /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1)
  [ -n "$f" ] && export LD_LIBRARY_PATH="$(dirname "$f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "libnccl: $f"
fi
nvidia-smi -L; nproc; uname -r
pack() { tar -czf "$OUT/$1.tgz" -C "$O" "$1" 2>/dev/null; }
for part in "$@"; do
  t0=$(date +%s)
  case $part in
    smoke)
      mkdir -p "$O/smoke"
      "$B/bin/tcpx-run" tune nccl --points 3 --size 4M --iters 2 --warmup 1 --minutes 1 \
        --reports "$O/smoke/reports" > "$O/smoke/tune.txt" 2>&1
      rc=$?; tail -n 12 "$O/smoke/tune.txt"; pack smoke
      [ $rc -eq 0 ] || { echo "smoke failed ($rc)"; exit 1; }
      ;;
    nccl) bash ci/real-tcpx/tune-onegpu.sh nccl "$B/bin" "$O"; pack nccl ;;
    tcpx)
      so="$B/so/libnccl-net.so"
      if [ ! -f "$so" ]; then
        (cd "$B" && CUDA_ARCHS=90 QUIET=1 bash "$OLDPWD/ci/real-tcpx/build.sh" plugin-src nccl-tree deps so) \
          > "$O/build.log" 2>&1 || { tail -n 30 "$O/build.log"; cp "$O/build.log" "$OUT/"; exit 1; }
      fi
      export LD_LIBRARY_PATH="$B/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
      bash ci/real-tcpx/tune-onegpu.sh tcpx "$B/bin" "$O" "$so"; pack tcpx ;;
    socket) bash ci/real-tcpx/tune-onegpu.sh socket "$B/bin" "$O"; pack socket ;;
    plan)
      # plans/tune_nccl.rhai through the plan runner: the target set detected (gpu-one on one
      # GPU) shown by the dry pass, then the run with the search's seconds from TUNE_SECONDS.
      mkdir -p "$O/plan"
      "$B/bin/tcpx-run" plans/tune_nccl.rhai --dry-run 2>&1 | tail -n 2 | tee "$O/plan/dry.txt"
      sed "s/^tune_seconds = .*/tune_seconds = ${TUNE_SECONDS:-240}/" plans/targets/gpu-one.toml > "$O/plan/gpu-one.toml"
      timeout 560 "$B/bin/tcpx-run" plans/tune_nccl.rhai --targets "$O/plan/gpu-one.toml" \
        --reports "$O/plan/reports" > "$O/plan/run.txt" 2>&1
      echo "== plan exit $?"; grep -vE '^(tcpx-run: experiment|  tune-)' "$O/plan/run.txt" | tail -n 15
      d=$(ls -d "$O"/plan/reports/* | tail -n 1); grep -vE '^#' "$d/tuned.env" | grep .; grep -E '^# (chosen|why)' "$d/tuned.env"
      rm -rf "$d/charts"; pack plan ;;
    *) echo "unknown part $part" ;;
  esac
  echo "== part $part: $(( $(date +%s) - t0 )) s"
done
