#!/usr/bin/env bash
# Makes the DEPS_PREFIX build.sh wants from Debian 12 packages: downloads the abseil, protobuf
# (library, headers, protoc) and googletest (its CMake config is required by the plugin's build)
# packages with apt-get and unpacks them under PREFIX, without installing anything. Run it where
# Debian's package sources are reachable; the prefix (about 30 MB) can then be copied to a build
# machine that has none.
#
#   ci/real-tcpx/deps.sh PREFIX
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 PREFIX" >&2; exit 1; }
mkdir -p "$1"; prefix=$(realpath "$1")
debs=$(mktemp -d); trap 'rm -rf "$debs"' EXIT
cd "$debs"
apt-get download libabsl-dev libabsl20220623 libprotobuf-dev libprotobuf32 libprotoc32 \
  protobuf-compiler libgtest-dev
for f in ./*.deb; do dpkg-deb -x "$f" "$prefix"; done
echo "deps.sh: unpacked $(ls ./*.deb | wc -l) packages into $prefix"
