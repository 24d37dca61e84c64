#!/usr/bin/env bash
# Builds Google's GPUDirect-TCPX NCCL net plugin (nccl-plugin-gpudirecttcpx) from a source tree the
# user provides, for tcpx-lab's `--transport netplugin`. Nothing is downloaded: the plugin source,
# an NCCL source tree (for its headers) and a prefix holding abseil and protobuf (see deps.sh) are
# given; the CUDA toolkit (nvcc, CUDA 12 or 13) and CMake must be installed.
#
#   ci/real-tcpx/build.sh PLUGIN_SRC NCCL_TREE DEPS_PREFIX OUT_DIR
#
# PLUGIN_SRC   checkout of nccl-plugin-gpudirecttcpx (its CMakeLists.txt at the top)
# NCCL_TREE    NCCL source tree, or the subset of it the plugin reads: src/include/,
#              src/device/network/unpack/, src/nccl.h.in, makefiles/version.mk (>= 2.19)
# DEPS_PREFIX  a directory with usr/include/{absl,google/protobuf}, usr/lib/x86_64-linux-gnu and
#              usr/bin/protoc (deps.sh makes one from Debian 12 packages), or / for installed ones
# OUT_DIR      receives libnccl-net.so (plus build/ and a BUILD-INFO file)
#
# Environment: CUDA_HOME (default /usr/local/cuda), CUDA_ARCHS (default 90, Hopper), JOBS,
# QUIET=1 (opt-in, for timing runs): the private copy drops the plugin's warning
# "requested receive on host mem buffer", which it logs on every poll of a host-memory receive
# (12,714 lines for one 4K..64M run); BUILD-INFO says quiet=1. The user's tree is untouched.
# The plugin's CMake file names /usr/local/cuda/bin/nvcc itself; CUDA_HOME must match it.
set -euo pipefail

die() { echo "build.sh: $*" >&2; exit 1; }
[ $# -eq 4 ] || die "usage: $0 PLUGIN_SRC NCCL_TREE DEPS_PREFIX OUT_DIR"
src=$(realpath "$1"); nccl=$(realpath "$2"); deps=$(realpath "$3"); mkdir -p "$4"; out=$(realpath "$4")
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
archs=${CUDA_ARCHS:-90}
jobs=${JOBS:-$(nproc)}

[ -f "$src/CMakeLists.txt" ] && [ -d "$src/src/rx_buf_mgr_client" ] \
  || die "$src is not an nccl-plugin-gpudirecttcpx checkout (no CMakeLists.txt / src/rx_buf_mgr_client)"
[ -x "$cuda/bin/nvcc" ] || die "no nvcc at $cuda/bin/nvcc: install the CUDA toolkit or set CUDA_HOME"
command -v cmake >/dev/null || die "cmake not found: install CMake >= 3.15"
[ -f "$nccl/src/nccl.h.in" ] && [ -f "$nccl/makefiles/version.mk" ] \
  || die "$nccl lacks src/nccl.h.in or makefiles/version.mk: give an NCCL source tree"
[ -f "$nccl/src/device/network/unpack/unpack_defs.h" ] \
  || die "$nccl lacks src/device/network/unpack/unpack_defs.h: NCCL 2.19 or newer is needed"
[ -f "$nccl/src/include/nccl_net.h" ] \
  || die "$nccl lacks src/include/nccl_net.h (NCCL >= 2.23 moved it; use 2.19 to 2.22)"
inc=$deps/usr/include
lib=$deps/usr/lib/x86_64-linux-gnu
[ -d "$inc/absl" ] || die "no abseil headers in $inc/absl: run ci/real-tcpx/deps.sh"
[ -f "$inc/google/protobuf/message.h" ] || die "no protobuf headers in $inc: run ci/real-tcpx/deps.sh"
protoc=$deps/usr/bin/protoc
[ -x "$protoc" ] || die "no protoc at $protoc: run ci/real-tcpx/deps.sh"
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# NCCL's build generates nccl.h from nccl.h.in; do the same into a view of the tree, so the
# user's tree is only read.
ver() { sed -n "s/^$1 *:= *//p" "$nccl/makefiles/version.mk"; }
major=$(ver NCCL_MAJOR); minor=$(ver NCCL_MINOR); patch=$(ver NCCL_PATCH); suffix=$(ver NCCL_SUFFIX)
view=$out/nccl-view
rm -rf "$view"; mkdir -p "$view/build/include"
ln -s "$nccl/src" "$view/src"
sed -e "s/\${nccl:Major}/$major/g" -e "s/\${nccl:Minor}/$minor/g" -e "s/\${nccl:Patch}/$patch/g" \
    -e "s/\${nccl:Suffix}/$suffix/g" \
    -e "s/\${nccl:Version}/$(printf '%d%02d%02d' "$major" "$minor" "$patch")/g" \
    "$nccl/src/nccl.h.in" > "$view/build/include/nccl.h"

# Two comment styles in the plugin's tree do not parse: its .proto files open with '#' lines,
# which protoc (at least up to 3.21) rejects, and its top CMakeLists.txt opens with a C-style
# '/* ... */' block, which CMake rejects. Build from a copy with both turned into the comment
# syntax of their language. The user's tree is only read.
work=$out/plugin-src
rm -rf "$work"; mkdir -p "$work"
(cd "$src" && tar -cf - --exclude=.git .) | tar -xf - -C "$work"
for p in "$work"/src/rx_buf_mgr_client/proto/*.proto; do sed -i -E 's|^#|//|' "$p"; done
while IFS= read -r -d '' c; do
  if head -1 "$c" | grep -q '^/\*'; then sed -i '1,/\*\//s|^|# |' "$c"; fi
done < <(find "$work" -name CMakeLists.txt -print0)

quiet=${QUIET:-0}
case $quiet in
  0) ;;
  1) n=$(grep -c 'WARN("NET/" PRODUCT_NAME " requested receive on host mem buffer");' \
           "$work/src/net_tcpx.cc" || true)
     [ "$n" = 1 ] || die "QUIET=1: the host-memory receive warning is not where it was expected \
in src/net_tcpx.cc (found $n times); build without QUIET"
     sed -i 's|WARN("NET/" PRODUCT_NAME " requested receive on host mem buffer");|/* QUIET=1: per-poll host-memory warning left out */|' \
       "$work/src/net_tcpx.cc" ;;
  *) die "QUIET=$quiet: use 0 or 1" ;;
esac

build=$out/build
# Unix Makefiles: the plugin's compile flags use make functions ($(subst ...)) for __FILENAME__.
cmake -G "Unix Makefiles" -S "$work" -B "$build" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PROJECT_INCLUDE="$here/compat.cmake" \
  -DTCPX_DEPS_INCLUDE="$inc" -DTCPX_DEPS_LIB="$lib" \
  -DCMAKE_PREFIX_PATH="$deps/usr" \
  -DCMAKE_CUDA_ARCHITECTURES="$archs" \
  -DCMAKE_CUDA_FLAGS="-include $here/shim/cuda_compat.h" \
  -DCUDAToolkit_ROOT="$cuda" \
  -DProtobuf_INCLUDE_DIR="$inc" -DProtobuf_LIBRARY="$lib/libprotobuf.so" \
  -DProtobuf_PROTOC_EXECUTABLE="$protoc" \
  -DNCCL_PATH="$view" -DNCCL_VERSION="$major.$minor.$patch" \
  -DNCCL_INCLUDE_PATH="$view/build/include" \
  -DNET_GPUDIRECTTCPX_EXPORT=nccl
# -k: on a failure, build what else can be built, so one run shows every error.
cmake --build "$build" --target nccl-net -j "$jobs" -- -k
cp "$build/libnccl-net.so" "$out/libnccl-net.so"
{
  echo "plugin_src=$src"
  # A checkout knows its commit; an exported tree may carry it in a COMMIT file.
  # (Only a checkout whose top is the tree itself: an exported tree inside another repository
  # would otherwise report that repository's commit.)
  if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" = "$src" ]; then
    commit=$(git -C "$src" rev-parse HEAD)
  else
    commit=$(cat "$src/COMMIT" 2>/dev/null || echo unknown)
  fi
  echo "plugin_commit=$commit"
  echo "nccl_headers=$major.$minor.$patch"
  echo "nvcc=$("$cuda/bin/nvcc" --version | tail -1)"
  echo "protobuf=$("$protoc" --version)"
  echo "cuda_archs=$archs"
  echo "quiet=$quiet"
} > "$out/BUILD-INFO"
echo "build.sh: built $out/libnccl-net.so"
echo "build.sh: at run time put $lib on LD_LIBRARY_PATH (abseil, protobuf)"
