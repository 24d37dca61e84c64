#!/usr/bin/env bash
# The GPU-machine call behind issue 41's bar: the watch shim in front of Google's GPUDirect-TCPX
# plugin under torch.distributed on one GPU as two NCCL hosts (ci/real-tcpx/watch-onegpu.sh:
# correctness, the shim's bytes against the job's, overhead with/without the shim at 1M and 256M).
#
#   bash docs/perf-data/issue41-gpu.sh [build] [run]      (both when none is given)
#
# `build` (Google's plugin, when absent) and `run` each fit one device command (10 minutes):
# give them as two calls when the plugin is not built yet.
# Expects, in ignored folders (carried): .device-bundle/watch/libtcpx_watch_plugin.so (a release
# build: `cargo build --release -p tcpx-watch-plugin`, then copy target/release/
# libtcpx_watch_plugin.so there), and .device-bundle/tune/ as docs/perf-data/issue42-gpu.sh
# describes it: bin/tcpx-rxdm-standin (and bin/tcpx-run, for `tcpx-run watch` on one run;
# optionally .xz), plus, unless so/libnccl-net.so is already there, plugin-src/, nccl-tree/ and
# deps/ to build Google's plugin with ci/real-tcpx/build.sh (into /tmp/issue41/so, which stays
# on the machine between calls while it is held). Leaves $OUT/watch.tgz (NCCL's logs,
# the shim's files per run, runs.jsonl) and prints the runs, summaries and verdict.
# Environment: REPS (3), ITERS (1M=40,256M=8), as watch-onegpu.sh.
set -uo pipefail
B=$(realpath .device-bundle/tune)
W=$(realpath .device-bundle/watch)
O=/tmp/issue41; mkdir -p "$O"
OUT=${OUT:-$O/out}; mkdir -p "$OUT"
for f in "$B"/bin/*.xz "$W"/*.xz; do [ -f "$f" ] && xz -dkf "$f"; done
chmod +x "$B"/bin/* 2>/dev/null
# Built outside the carried bundle, so a later call that carries it again keeps the plugin.
so="$B/so/libnccl-net.so"; [ -f "$so" ] || so="$O/so/libnccl-net.so"
parts=("$@"); [ ${#parts[@]} -eq 0 ] && parts=(build run)
rc=0
for part in "${parts[@]}"; do
  t0=$(date +%s)
  case $part in
    build)
      if [ ! -f "$so" ]; then
        (cd "$B" && CUDA_ARCHS=90 QUIET=1 bash "$OLDPWD/ci/real-tcpx/build.sh" plugin-src nccl-tree deps "$O/so") \
          > "$O/build.log" 2>&1 || { tail -n 30 "$O/build.log"; cp "$O/build.log" "$OUT/"; exit 1; }
      fi
      ls -la "$so" ;;
    run)
      [ -f "$so" ] || { echo "no plugin at $so: run the build part first"; exit 1; }
      DEPS_LIB="$B/deps/usr/lib/x86_64-linux-gnu" \
        bash ci/real-tcpx/watch-onegpu.sh "$so" "$W/libtcpx_watch_plugin.so" "$B/bin" "$O/watch"
      rc=$?
      tar -czf "$OUT/watch.tgz" -C "$O" watch 2>/dev/null ;;
    *) echo "unknown part $part"; rc=2 ;;
  esac
  echo "== part $part: $(( $(date +%s) - t0 )) s"
done
exit "$rc"
